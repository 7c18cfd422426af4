"""docs/model.md's table of the studied checkpoints is what the import plan gives them."""

from attnserve.export.hf_import import config_from_hf
from attnserve.export.studied import MACHINES_GIB, STUDIED, checkpoint_plan, plan_table
from attnserve.model.footprint import GiB, import_bytes
from tests.conftest import REPO_ROOT


def test_the_table_in_docs_is_the_plans():
    assert plan_table() in (REPO_ROOT / "docs" / "model.md").read_text()


def test_float32_is_planned_exactly_where_its_import_fits():
    for name, data in STUDIED.items():
        need = import_bytes(config_from_hf(data, name))
        for gib in MACHINES_GIB:
            fits = need <= gib * GiB - GiB
            assert (checkpoint_plan(name, gib) == "float32") == fits, (name, gib)
