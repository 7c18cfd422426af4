"""`python -m service` as `make serve` runs it (a one-shot run until the gRPC server lands)."""

from tests.conftest import run_module


def test_runs_the_model_once_and_prints_what_came_back(small_model_dir):
    result = run_module(
        "service", "--model", str(small_model_dir), "--provider", "cpu", "--text", "héllo"
    )
    assert result.returncode == 0, result.stderr
    assert "'héllo' -> 7 tokens" in result.stdout  # <bos> + 6 UTF-8 bytes
    assert "embeddings (1, 7, 64) float32" in result.stdout
    assert "attentions (1, 2, 4, 7, 7) float32" in result.stdout
    assert "settings: Settings(" in result.stderr  # settings are logged at start


def test_model_directory_from_the_environment(small_model_dir):
    result = run_module(
        "service", env={"ATTNSERVE_MODEL_DIR": str(small_model_dir), "ATTNSERVE_PROVIDER": "cpu"}
    )
    assert result.returncode == 0, result.stderr


def test_missing_model_is_a_clear_error(tmp_path):
    result = run_module("service", "--model", str(tmp_path), "--provider", "cpu")
    assert result.returncode == 1
    assert "no model.onnx in" in result.stderr
