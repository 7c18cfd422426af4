"""How many copies of its weights a served model holds, decided from the memory there is.

The memory figure is lowered (settings.memory_limit) so that the small model takes the
paths a 1B model takes on this machine: refused when one copy does not fit, one ONNX
Runtime session when a second copy would not (docs/BENCHMARKS.md measures the real ones).
"""

from dataclasses import replace

import numpy as np
import pytest

from attnserve.model.artifacts import ModelDirectory
from attnserve.model.footprint import SERVE_BASE_BYTES
from attnserve.service.core.budget import ByteBudget
from attnserve.service.core.errors import ModelLoadError
from attnserve.service.core.metrics import Metrics
from attnserve.service.models import EXTRA_COPIES_SHARE, build_model, session_layout
from attnserve.service.ort.runtime import OrtRuntime
from attnserve.service.settings import Settings
from tests.conftest import SMALL_CONFIG, linked_copy


@pytest.fixture()
def weights(small_model_dir) -> int:
    return ModelDirectory(small_model_dir).weight_bytes("fp32")


def _settings(small_model_dir, memory_limit: int) -> Settings:
    return Settings(model=small_model_dir, provider="cpu", memory_limit=memory_limit)


def test_a_model_whose_weights_do_not_fit_is_refused_with_the_numbers(small_model_dir, weights):
    settings = _settings(small_model_dir, SERVE_BASE_BYTES + weights // 2)
    with pytest.raises(ModelLoadError, match=r"needs about .* GiB to serve .* is available"):
        session_layout(ModelDirectory(small_model_dir), settings)


def test_a_second_copy_that_would_not_fit_leaves_one_session(
    small_model_dir, small_runtime, weights
):
    # One copy fits; a second would pass the share that extra copies may take.
    limit = SERVE_BASE_BYTES + weights + int(weights / EXTRA_COPIES_SHARE) - 1
    options, instances = session_layout(
        ModelDirectory(small_model_dir), _settings(small_model_dir, limit)
    )
    assert options.single_session and instances == 1
    runtime = OrtRuntime(small_model_dir, options)
    assert runtime.embeddings_session is runtime.session  # one session, one copy
    assert runtime.weights_info.resident_bytes == weights
    # It answers embeddings and attention as the usual two sessions do.
    ids = np.random.default_rng(3).integers(0, SMALL_CONFIG.vocab_size, size=(2, 21))
    np.testing.assert_allclose(runtime.embed(ids), small_runtime.embed(ids), atol=1e-5)
    for got, want in zip(runtime.run(ids), small_runtime.run(ids), strict=True):
        np.testing.assert_allclose(got, want, atol=1e-5)


def test_cheap_copies_keep_the_sessions_and_instances(small_model_dir, weights):
    plenty = 1 << 40
    options, instances = session_layout(
        ModelDirectory(small_model_dir), _settings(small_model_dir, plenty)
    )
    assert not options.single_session and instances == 0  # the default: one per core
    runtime = OrtRuntime(small_model_dir, options)
    assert runtime.embeddings_session is not runtime.session
    assert runtime.weights_info.resident_bytes == 2 * weights
    # Asked for, instances are made whatever they cost.
    asked = replace(_settings(small_model_dir, SERVE_BASE_BYTES + weights), instances=2)
    assert session_layout(ModelDirectory(small_model_dir), asked)[1] == 2


def test_saes_cost_their_weights_once_and_count_in_the_fit(model_with_sae, weights):
    """The instances share the first backend's SAE sessions; the model info counts their
    weights once; a model that fits only without its SAEs is refused, naming them."""
    sae_bytes = ModelDirectory(model_with_sae).sae_bytes()
    assert sae_bytes > 0
    settings = replace(_settings(model_with_sae, 1 << 40), instances=2)
    plane = build_model(settings, Metrics(), ByteBudget(0), None, "1", model_with_sae, [])
    instances = [lane.backend for lane in plane.engine._narrow]
    assert len(instances) == 2
    assert all(i.sae_graphs is plane.backend.sae_graphs for i in instances)
    sessions = 2 * (1 + len(instances))  # each copy: the full graph and the embeddings'
    assert plane.weights.resident_bytes == sessions * weights + sae_bytes
    tight = _settings(model_with_sae, SERVE_BASE_BYTES + weights + sae_bytes // 2)
    with pytest.raises(ModelLoadError, match=r"GiB of SAEs\) and"):
        session_layout(ModelDirectory(model_with_sae), tight)


@pytest.fixture()
def model_with_sae(small_model_dir, tmp_path):
    from attnserve.export.sae import add_sae
    from tests.export.test_sae import saelens_sae

    model_dir = linked_copy(small_model_dir, tmp_path / "model")
    _, source = saelens_sae(tmp_path, "standard")
    add_sae(model_dir, source, name="resid", log=lambda _: None)
    return model_dir


def test_generation_packs_its_own_copy_only_where_it_takes_half_of_what_is_left(
    small_model_dir, small_runtime, weights
):
    """A model served by one session: its decode graph packs a copy of its own where that
    takes at most half of the memory left after the one copy (texts written together at
    packed speed), else reads the one copy's file; the same tokens either way."""
    from tests.service.ort.test_readouts import prepacking

    ids = np.arange(5, 17, dtype=np.int64)
    want = small_runtime.decode_batch().prefill(ids, {}).advance(len(ids))
    for rest, packed in ((2 * weights, True), (2 * weights - 1, False)):
        limit = SERVE_BASE_BYTES + weights + rest
        settings = _settings(small_model_dir, limit)
        options, _ = session_layout(ModelDirectory(small_model_dir), settings)
        assert options.single_session and options.packed_decode is packed
        runtime = OrtRuntime(small_model_dir, options)
        first = runtime.decode_batch().prefill(ids, {}).advance(len(ids))
        np.testing.assert_allclose(first, want, atol=1e-5)
        assert prepacking(runtime) == [True, packed]  # the one session's, the decode graph's
