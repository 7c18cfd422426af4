import argparse
from dataclasses import fields
from pathlib import Path

import pytest

from attnserve.service.settings import (
    Settings,
    add_settings_arguments,
    env_name,
    settings_from_args,
)


def parse(argv, environ):
    parser = add_settings_arguments(argparse.ArgumentParser())
    return settings_from_args(parser.parse_args(argv), environ)


def test_defaults():
    settings = parse(["--model", "m"], {})
    assert settings == Settings(model=Path("m"))
    assert settings.runtime_options.provider == "auto"


def test_flag_beats_environment_beats_default():
    env = {"ATTNSERVE_MODEL": "from-env", "ATTNSERVE_THREADS": "3", "ATTNSERVE_MAX_QUEUE": "7"}
    settings = parse(["--threads", "1"], env)
    assert settings.model == Path("from-env")  # env over nothing
    assert settings.threads == 1  # flag over env
    assert settings.max_queue == 7  # env over default
    assert settings.provider == "auto"  # default


def test_every_setting_has_one_name_as_field_flag_and_variable():
    parser = add_settings_arguments(argparse.ArgumentParser())
    flags = {a.dest: a.option_strings for a in parser._actions if a.dest != "help"}
    for f in fields(Settings):
        assert flags[f.name] == ["--" + f.name.replace("_", "-")]
        assert env_name(f.name) == "ATTNSERVE_" + f.name.upper()


@pytest.mark.parametrize(("text", "value"), [("true", True), ("0", False), ("off", False)])
def test_boolean_settings_from_flag_or_environment(text, value):
    assert parse(["--model", "m", "--intra-op-spinning", text], {}).intra_op_spinning is value
    env = {"ATTNSERVE_INTRA_OP_SPINNING": text}
    settings = parse(["--model", "m"], env)
    assert settings.intra_op_spinning is value
    assert settings.runtime_options.intra_op_spinning is value


def test_a_model_or_a_repository_is_required_but_not_both():
    with pytest.raises(ValueError, match=r"--model DIR or --model-repository DIR"):
        parse([], {})
    with pytest.raises(ValueError, match=r"one of the two"):
        parse(["--model", "a"], {"ATTNSERVE_MODEL_REPOSITORY": "models"})
    assert parse([], {"ATTNSERVE_MODEL_REPOSITORY": "models"}).model_repository == Path("models")
    # An empty variable is unset: Compose clears the image's ATTNSERVE_MODEL so.
    env = {"ATTNSERVE_MODEL": "", "ATTNSERVE_MODEL_REPOSITORY": "/repository"}
    settings = parse([], env)
    assert settings.model is None and settings.model_repository == Path("/repository")


def test_invalid_environment_value_names_the_variable():
    with pytest.raises(ValueError, match="ATTNSERVE_THREADS='many' is not a valid int"):
        parse(["--model", "m"], {"ATTNSERVE_THREADS": "many"})
    with pytest.raises(ValueError, match=r"ATTNSERVE_LOG_LEVEL='LOUD' is not one of"):
        parse(["--model", "m"], {"ATTNSERVE_LOG_LEVEL": "LOUD"})


def test_settings_validate_their_values():
    with pytest.raises(ValueError, match=r"ATTNSERVE_PROVIDER='tpu' is not one of"):
        parse(["--model", "m"], {"ATTNSERVE_PROVIDER": "tpu"})
    with pytest.raises(ValueError, match="provider must be one of"):
        Settings(model=Path("m"), provider="tpu")
    with pytest.raises(ValueError, match="log_level"):
        Settings(model=Path("m"), log_level="LOUD")


def test_server_settings_reach_the_components():
    settings = parse(
        [
            "--model",
            "m",
            "--max-batch-tokens",
            "2048",
            "--max-batch-delay-ms",
            "1.5",
            "--max-queue",
            "9",
        ],
        {"ATTNSERVE_AUTH_TOKEN": "hunter2"},
    )
    options = settings.batcher_options
    assert (options.max_batch_tokens, options.max_delay_s, options.max_queue) == (2048, 0.0015, 9)
    assert settings.auth_token == "hunter2"
    assert "hunter2" not in repr(settings)  # settings are logged; secrets are not


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"port": 70000}, "port must be in"),
        ({"max_message_bytes": 10}, "max_message_bytes must be >= 1024"),
        ({"grace_seconds": -1.0}, "grace_seconds must be >= 0"),
        ({"release_after_idle_s": -1.0}, "release_after_idle_s must be >= 0"),
        ({"tls_key": Path("k.pem")}, "tls_cert and tls_key go together"),
    ],
)
def test_invalid_server_settings(overrides, message):
    with pytest.raises(ValueError, match=message):
        Settings(model=Path("m"), **overrides)


def test_the_deployment_page_lists_every_setting_by_flag_and_variable():
    from tests.conftest import REPO_ROOT

    rows = [
        line
        for line in (REPO_ROOT / "docs" / "deployment.md").read_text().splitlines()
        if line[:3] == "| `"
    ]
    for f in fields(Settings):
        flag, variable = "`--" + f.name.replace("_", "-") + "`", "`" + env_name(f.name) + "`"
        assert any(flag in row and variable in row for row in rows), f.name
