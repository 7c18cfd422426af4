import argparse
from pathlib import Path

import pytest

from service.settings import Settings, add_settings_arguments, settings_from_args


def parse(argv, environ):
    parser = add_settings_arguments(argparse.ArgumentParser(), environ)
    return settings_from_args(parser.parse_args(argv))


def test_defaults():
    settings = parse(["--model", "m"], {})
    assert settings == Settings(model_dir=Path("m"))
    assert settings.runtime_options.provider == "auto"


def test_flag_beats_environment_beats_default():
    env = {"ATTNSERVE_MODEL_DIR": "from-env", "ATTNSERVE_INTRA_OP_THREADS": "3"}
    settings = parse(["--threads", "1"], env)
    assert settings.model_dir == Path("from-env")  # env over nothing
    assert settings.intra_op_threads == 1  # flag over env
    assert settings.provider == "auto"  # default


@pytest.mark.parametrize(("text", "value"), [("true", True), ("0", False), ("off", False)])
def test_boolean_settings_from_flag_or_environment(text, value):
    assert parse(["--model", "m", "--intra-op-spinning", text], {}).intra_op_spinning is value
    env = {"ATTNSERVE_INTRA_OP_SPINNING": text}
    settings = parse(["--model", "m"], env)
    assert settings.intra_op_spinning is value
    assert settings.runtime_options.intra_op_spinning is value


def test_model_is_required_without_environment(capsys):
    with pytest.raises(SystemExit):
        parse([], {})
    assert "--model" in capsys.readouterr().err


def test_invalid_environment_value_names_the_variable(capsys):
    with pytest.raises(SystemExit):
        parse(["--model", "m"], {"ATTNSERVE_INTRA_OP_THREADS": "many"})
    assert "ATTNSERVE_INTRA_OP_THREADS='many' is not a valid int" in capsys.readouterr().err


def test_settings_validate_their_values():
    with pytest.raises(ValueError, match="provider must be one of"):
        parse(["--model", "m"], {"ATTNSERVE_PROVIDER": "tpu"})
    with pytest.raises(ValueError, match="log_level"):
        Settings(model_dir=Path("m"), log_level="LOUD")
