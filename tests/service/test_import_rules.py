"""Each folder of the service imports only what its role allows: the data plane (core) no
transport and no engine, the engine (ort) no transport, the transports no engine. Read from
the source (every import statement, at any depth), so a new module is covered as written."""

import ast
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

SERVICE = REPO_ROOT / "service"
TRANSPORTS = ("grpc", "http", "oip", "ray")
ENGINE = ("attnserve.service.ort", "onnxruntime", "onnx", "torch")
RULES = {  # folder -> module prefixes it must not import
    "core": (*(f"attnserve.service.{t}" for t in TRANSPORTS), *ENGINE, "fastapi", "starlette"),
    "ort": (*(f"attnserve.service.{t}" for t in TRANSPORTS), "fastapi", "starlette", "torch"),
    **dict.fromkeys(TRANSPORTS[:3], ENGINE),
}


def imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import in `path`."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.append((node.lineno, node.module))
    return found


def broken(folder: str, service: Path = SERVICE) -> list[str]:
    forbidden = RULES[folder]
    return [
        f"{path.relative_to(service.parent)}:{line} imports {module}"
        for path in sorted((service / folder).glob("*.py"))
        for line, module in imports(path)
        if any(module == f or module.startswith(f + ".") for f in forbidden)
    ]


@pytest.mark.parametrize("folder", RULES)
def test_a_folder_imports_only_what_its_role_allows(folder):
    assert (SERVICE / folder).is_dir()
    assert broken(folder) == []


def test_the_rules_see_an_import_that_breaks_them(tmp_path):
    """The check itself: a transport module that reached for the engine is named."""
    (tmp_path / "service" / "grpc").mkdir(parents=True)
    (tmp_path / "service" / "grpc" / "bad.py").write_text(
        "def f():\n    from attnserve.service.ort.runtime import OrtRuntime\n"
    )
    assert broken("grpc", tmp_path / "service") == [
        "service/grpc/bad.py:2 imports attnserve.service.ort.runtime"
    ]
