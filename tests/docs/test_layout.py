"""docs/development.md's layout names every module of the installed package, in the folder
it lives in, and names no module that is not there: the page a newcomer reads first stays
the tree. (perf/, research/ and tests/ are described as wholes.)"""

from __future__ import annotations

import re

from tests.conftest import REPO_ROOT

WHOLES = ("perf", "research", "tests")


def layout() -> dict[str, str]:
    """Each folder of the layout block ("model", "service/core") -> the text describing it."""
    text = (REPO_ROOT / "docs" / "development.md").read_text()
    block = text.split("## Layout", 1)[1].split("\n## ", 1)[0]
    sections: dict[str, str] = {}
    top = sub = None
    for line in block.splitlines():
        if not line.startswith("    "):
            continue
        folder = re.match(r"    (\w+)/\s", line + " ")
        nested = re.match(r"      (\w+)/\s", line + " ")
        module = re.match(r"      (\w+\.py)\s", line + " ")
        if folder:
            top, sub = folder.group(1), None
        elif nested and top:
            sub = f"{top}/{nested.group(1)}"
        elif module:  # a module of the top folder after its subfolders (service/models.py)
            sub = None
        key = sub or top
        if key:
            sections[key] = sections.get(key, "") + line + "\n"
    return sections


def test_the_layout_names_every_module_where_it_lives():
    sections = layout()
    missing = [
        f"{folder}/{path.name}"
        for folder, text in sections.items()
        if folder not in WHOLES and (REPO_ROOT / folder).is_dir()
        for path in sorted((REPO_ROOT / folder).glob("*.py"))
        if path.name != "__init__.py" and not re.search(rf"(?<![\w/]){path.name}\b", text)
    ]
    assert missing == []
    folders = {p.parent.relative_to(REPO_ROOT).as_posix() for p in REPO_ROOT.glob("*/*.py")}
    folders |= {
        p.parent.relative_to(REPO_ROOT).as_posix() for p in REPO_ROOT.glob("service/*/*.py")
    }
    unlisted = sorted(f for f in folders if f not in sections and f.split("/")[0] not in WHOLES)
    assert unlisted == [], "folders the layout does not describe"


def test_the_layout_names_no_module_that_is_not_there():
    ghosts = [
        f"{folder}/{name}"
        for folder, text in layout().items()
        if folder not in WHOLES
        for name in re.findall(r"(?<![\w/.])(\w+\.py)\b", text)
        if not (REPO_ROOT / folder / name).is_file()
    ]
    assert ghosts == []


def request_paths() -> str:
    text = (REPO_ROOT / "docs" / "development.md").read_text()
    return text.split("## How a request travels", 1)[1].split("\n## ", 1)[0]


def test_the_request_paths_name_modules_and_functions_that_are_there():
    """The paths a request takes (Encode, generation, V2 with an SAE, patching) name the
    service's modules as folder/module.py and its calls as Name.call() or module.py's
    call(): each is in the tree, where the page says."""
    text = request_paths()
    service = REPO_ROOT / "service"
    modules = set(re.findall(r"(?<![\w/])(\w+/\w+\.py)\b", text))
    assert len(modules) > 20
    assert sorted(m for m in modules if not (service / m).is_file()) == []
    source = "\n".join(p.read_text() for p in service.rglob("*.py"))
    calls = re.findall(r"(?:(\w+)\.|\b)(\w+)\(\)", text)
    assert len(calls) > 5
    missing = []
    for owner, name in calls:
        if owner and not re.search(rf"^class {owner}\b", source, re.M):
            missing.append(f"class {owner}")
        if not re.search(rf"^\s*(?:async )?def {name}\(", source, re.M):
            missing.append(f"def {name}")
    assert missing == []
