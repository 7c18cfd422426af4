"""A model directory builds its encoder again from its float32 weights file (export/
read_back.py): the same parameters as the checkpoint's import, memory-mapped, and the same
outputs; the file's index names every parameter, and nothing in it twice."""

import json

import pytest
import torch

from attnserve.export.hf_import import load_hf
from attnserve.export.read_back import ReadBackError, read_encoder
from attnserve.model.artifacts import WEIGHTS_INDEX_FILENAME


@pytest.mark.parametrize("family", ["gemma2", "llama"])
def test_the_directory_reads_back_its_encoder(families, family):
    directory, _ = families.checkpoint(family)
    imported, _ = load_hf(directory, log=lambda _: None)
    read = read_encoder(families.exported(family))
    assert read.config == imported.config
    mine, theirs = dict(read.named_parameters()), dict(imported.named_parameters())
    assert mine.keys() == theirs.keys()
    for name, tensor in theirs.items():
        assert torch.equal(mine[name], tensor), name
    ids = torch.randint(0, imported.config.vocab_size, (1, 9))
    with torch.no_grad():  # (views of transposed weights: other kernels, the last bits)
        torch.testing.assert_close(read.logits(ids), imported.logits(ids), atol=1e-5, rtol=0)
    index = json.loads((families.exported(family) / WEIGHTS_INDEX_FILENAME).read_text())
    places = [(t["offset"], t["length"]) for t in index["tensors"].values()]
    assert len(set(places)) == len(places)  # each tensor once


def test_a_directory_without_an_index_says_why(tmp_path, families):
    out = tmp_path / "old"
    out.mkdir()
    for item in families.exported("llama").iterdir():
        if item.name != WEIGHTS_INDEX_FILENAME:
            (out / item.name).symlink_to(item)
    with pytest.raises(ReadBackError, match=r"no weights\.json.*export it again"):
        read_encoder(out)
