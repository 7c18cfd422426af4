"""`attnserve serve` start-up failures: clear messages, non-zero exits."""

from tests.conftest import run_cli


def test_missing_model_is_a_clear_error(tmp_path):
    result = run_cli(
        "serve",
        "--model",
        str(tmp_path),
        "--provider",
        "cpu",
        "--port",
        "0",
        "--metrics-port",
        "-1",
    )
    assert result.returncode == 1
    assert "cannot serve: no model.onnx in" in result.stderr


def test_a_repository_without_models_is_a_clear_error(tmp_path, small_model_dir):
    flags = ("--provider", "cpu", "--port", "0", "--metrics-port", "-1", "--http-port", "-1")
    empty = run_cli("serve", "--model-repository", str(tmp_path), *flags)
    assert empty.returncode == 1
    assert f"--model-repository {tmp_path}: no model in it" in empty.stderr
    missing = run_cli("serve", "--model-repository", str(tmp_path / "nope"), *flags)
    assert missing.returncode == 1 and "not a directory" in missing.stderr
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "1").symlink_to(small_model_dir)
    wrong = run_cli("serve", "--model-repository", str(tmp_path), "--default-model", "b", *flags)
    assert wrong.returncode == 1
    assert "--default-model b: no such model served; served: a" in wrong.stderr


def test_settings_are_validated_and_logged(small_model_dir):
    result = run_cli("serve", "--model", str(small_model_dir), "--tls-cert", "c.pem")
    assert result.returncode == 2
    assert "tls_cert and tls_key go together" in result.stderr
    result = run_cli(
        "serve", env={"ATTNSERVE_MODEL": str(small_model_dir), "ATTNSERVE_MAX_QUEUE": "lots"}
    )
    assert result.returncode == 2
    assert "ATTNSERVE_MAX_QUEUE='lots' is not a valid int" in result.stderr


def test_help_lists_every_setting_with_its_variable():
    result = run_cli("serve", "--help")
    assert result.returncode == 0
    for env in (
        "ATTNSERVE_MODEL",
        "ATTNSERVE_PORT",
        "ATTNSERVE_MAX_BATCH_TOKENS",
        "ATTNSERVE_GRACE_SECONDS",
        "ATTNSERVE_AUTH_TOKEN",
        "ATTNSERVE_TLS_CERT",
    ):
        assert env in result.stdout
