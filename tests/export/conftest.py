"""Fixtures of the export tests."""

from pathlib import Path

import pytest

from tests.conftest import linked_copy


@pytest.fixture
def model_dir(small_model_dir, tmp_path) -> Path:
    """The session's small model directory, linked into this test's own (what is added to
    it, such as an SAE, leaves the shared one untouched)."""
    return linked_copy(small_model_dir, tmp_path / "model")
