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
