"""Each folder of the service imports only what its role allows, in layers: the data plane
(core), generation (generate: planned, scheduled and detokenized texts, run by the core's
engine), attribution graphs (circuits) and the runtime (ort) speak no API; the protocols
(v1: attnserve.v1's messages, oip: the Open Inference Protocol's, neuronpedia: Neuronpedia's
activation API, openai: OpenAI's completions, chat and embeddings) translate between one
API and the core; the transports (grpc, http) carry them; ray/ hosts it all on Ray Serve.
Nothing imports a layer above its own, no protocol the other, no transport the
engine. Read from the source (every import statement, at any depth), so a new module is
covered as written."""

import ast
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

SERVICE = REPO_ROOT / "service"
ENGINE = ("attnserve.service.ort", "onnxruntime", "onnx", "torch")
WEB = ("fastapi", "starlette")
# the generated code and the wire of each API (attnserve/v1, attnserve/oip), and gRPC's
APIS = ("attnserve.v1", "attnserve.oip", "grpc", "google.protobuf")


def _folders(*names: str) -> tuple[str, ...]:
    return tuple(f"attnserve.service.{name}" for name in names)


PROTOCOLS = ("v1", "oip", "neuronpedia", "openai")
SERVING = _folders("core.engine", "core.dataplane", "core.repository")
RULES = {  # folder -> module prefixes it must not import
    "core": (*_folders(*PROTOCOLS, "grpc", "http", "ray"), *ENGINE, *WEB, *APIS),
    # generation: below the core's serving modules, which run it (no circle)
    "generate": (*_folders(*PROTOCOLS, "grpc", "http", "ray"), *SERVING, *ENGINE, *WEB, *APIS),
    # attribution graphs: a wing of the core, as generation (run by the core's serving)
    "circuits": (*_folders(*PROTOCOLS, "grpc", "http", "ray"), *SERVING, *ENGINE, *WEB, *APIS),
    "ort": (*_folders(*PROTOCOLS, "grpc", "http", "ray"), *WEB, *APIS, "torch"),
    "v1": (*_folders("oip", "neuronpedia", "openai", "grpc", "http", "ray"), *ENGINE, *WEB,
           "attnserve.oip", "grpc"),
    "oip": (*_folders("v1", "neuronpedia", "openai", "grpc", "http", "ray"), *ENGINE, *WEB,
            "attnserve.v1", "grpc"),
    "neuronpedia": (*_folders("v1", "oip", "openai", "grpc", "http", "ray"), *ENGINE, *WEB,
                    *APIS),
    "openai": (*_folders("v1", "oip", "neuronpedia", "grpc", "http", "ray"), *ENGINE, *WEB,
               *APIS),
    "grpc": (*_folders("http", "ray"), *ENGINE, *WEB),
    "http": (*_folders("grpc", "ray"), *ENGINE),
    "ray": ENGINE,
}  # fmt: skip


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


def test_every_folder_has_rules():
    folders = {p.name for p in SERVICE.iterdir() if p.is_dir() and any(p.glob("*.py"))}
    assert folders == set(RULES)


def test_the_rules_see_an_import_that_breaks_them(tmp_path):
    """The check itself: a transport module that reached for the engine is named."""
    (tmp_path / "service" / "grpc").mkdir(parents=True)
    (tmp_path / "service" / "grpc" / "bad.py").write_text(
        "def f():\n    from attnserve.service.ort.runtime import OrtRuntime\n"
    )
    assert broken("grpc", tmp_path / "service") == [
        "service/grpc/bad.py:2 imports attnserve.service.ort.runtime"
    ]


def test_the_core_may_not_speak_an_api(tmp_path):
    (tmp_path / "service" / "core").mkdir(parents=True)
    (tmp_path / "service" / "core" / "bad.py").write_text(
        "import grpc\nfrom attnserve.v1 import encoder_service_pb2 as pb\n"
    )
    assert broken("core", tmp_path / "service") == [
        "service/core/bad.py:1 imports grpc",
        "service/core/bad.py:2 imports attnserve.v1",
    ]


def backend_reads(folder: str, service: Path = SERVICE) -> list[str]:
    """Where a module of `folder` reads an object's `.backend`."""
    return [
        f"{path.relative_to(service.parent)}:{node.lineno}"
        for path in sorted((service / folder).glob("*.py"))
        for node in ast.walk(ast.parse(path.read_text(), str(path)))
        if isinstance(node, ast.Attribute) and node.attr == "backend"
    ]


@pytest.mark.parametrize("folder", [*PROTOCOLS, "grpc", "http", "ray"])
def test_protocols_and_transports_read_the_model_off_the_data_plane(folder):
    """They ask the data plane (DataPlane.view, core/view.py), never its backend."""
    assert backend_reads(folder) == []


def test_a_read_of_the_backend_is_named(tmp_path):
    (tmp_path / "service" / "http").mkdir(parents=True)
    (tmp_path / "service" / "http" / "bad.py").write_text(
        "def f(plane):\n    return plane.backend.saes\n"
    )
    assert backend_reads("http", tmp_path / "service") == ["service/http/bad.py:2"]
