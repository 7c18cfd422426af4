"""The attention explorer in a real browser: Debian's Chromium, driven by Playwright.

A shared URL renders its view directly; the map has one row and one column per
token; hovering a cell names the tokens and shows the very weight the gRPC API
returns; views, the last-row mode and the entropy grid switch what is drawn; two models
or two texts compare side by side, synced, with a difference map; the page fetches
nothing from anywhere but the server.
"""

from __future__ import annotations

import json
import shutil
from urllib.parse import quote

import httpx
import numpy as np
import pytest

from attnserve.client import EncoderClient
from tests.ci import skip_or_fail_in_ci
from tests.conftest import OTHER_CONFIG, SMALL_CONFIG, ServerThread

TEXT = "The cat sat on the mat."
BROWSER_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture(scope="module")
def browser():
    chromium = shutil.which("chromium")
    if chromium is None:
        skip_or_fail_in_ci("no chromium: `make test` installs it (deploy/browser-setup.sh)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=chromium, args=BROWSER_ARGS)
        yield launched
        launched.close()


@pytest.fixture
def page(browser, server):
    context = browser.new_context(viewport={"width": 1400, "height": 1400})
    page = context.new_page()
    page.elsewhere = []  # every request that did not go to the server
    page.on(
        "request",
        lambda r: None if r.url.startswith(server.http_url) else page.elsewhere.append(r.url),
    )
    yield page
    context.close()


def hover_cell(page, row: int, col: int) -> str:
    canvas = page.locator("#heatmap")
    cell, margin = (float(canvas.get_attribute(f"data-{k}")) for k in ("cell", "margin"))
    canvas.scroll_into_view_if_needed()
    box = canvas.bounding_box()
    page.mouse.move(box["x"] + margin + (col + 0.5) * cell, box["y"] + margin + (row + 0.5) * cell)
    info = page.locator(f'#hover-info[data-row="{row}"][data-col="{col}"]')
    info.wait_for()
    return info.text_content()


def rollout(attention: np.ndarray, upto: int) -> np.ndarray:
    """Abnar & Zuidema over layers 0..upto, heads averaged: the explorer's definition."""
    t = attention.shape[-1]
    result = np.eye(t)
    for layer in range(upto + 1):
        a = 0.5 * attention[layer].mean(axis=0) + 0.5 * np.eye(t)
        result = (a / a.sum(axis=-1, keepdims=True)) @ result
    return result


def test_a_shared_url_renders_and_every_view_shows_the_servers_numbers(
    page, server, client, tmp_path
):
    expected = client.encode(TEXT, attention=True, return_tokens=True)[0]
    t = len(expected.token_ids)
    page.goto(f"{server.http_url}/?text={quote(TEXT)}&layer=1&head=2&view=head")
    heatmap = page.locator("#heatmap[data-rows]")
    heatmap.wait_for()
    assert heatmap.get_attribute("data-rows") == heatmap.get_attribute("data-cols") == str(t)
    assert (page.input_value("#layer"), page.input_value("#head")) == ("1", "2")

    # The colour scale runs from 0 to the largest weight of the head shown.
    peak = expected.attention[1, 2][np.tril_indices(t)].max()
    assert float(page.locator("#scale-max").text_content()) == pytest.approx(peak, abs=2e-3)

    # Hovering a cell names both tokens and shows the weight gRPC returns (float16 on the way).
    info = hover_cell(page, row=5, col=3)
    assert f'query 5 "{expected.tokens[5]}" -> key 3 "{expected.tokens[3]}"' in info
    assert float(info.rsplit(" ", 1)[1]) == pytest.approx(expected.attention[1, 2, 5, 3], abs=2e-3)

    page.select_option("#view", "mean")
    page.locator('#heatmap[data-view="mean"]').wait_for()
    mean = expected.attention[1].mean(axis=0)
    assert float(hover_cell(page, 7, 1).rsplit(" ", 1)[1]) == pytest.approx(mean[7, 1], abs=2e-3)

    page.select_option("#view", "rollout")
    page.locator('#heatmap[data-view="rollout"]').wait_for()
    rolled = rollout(expected.attention, upto=1)
    weight = float(hover_cell(page, t - 1, 0).rsplit(" ", 1)[1])
    assert weight == pytest.approx(rolled[t - 1, 0], abs=3e-3)
    assert "view=rollout" in page.url  # the state travels in the URL
    page.screenshot(path=str(tmp_path / "explorer-rollout.png"))

    page.select_option("#rows", "last")  # long texts: only the last token's row
    page.locator('#heatmap[data-rows="1"]').wait_for()
    assert heatmap.get_attribute("data-cols") == str(t)

    # The entropy grid has a cell per layer and head; a click shows that head.
    cells = page.locator("#entropy td")
    assert cells.count() == 2 * 4
    page.locator('#entropy td[data-layer="0"][data-head="3"]').click()
    page.locator('#heatmap[data-view="head"]').wait_for()
    assert (page.input_value("#layer"), page.input_value("#head")) == ("0", "3")
    page.screenshot(path=str(tmp_path / "explorer.png"))
    assert (tmp_path / "explorer.png").read_bytes()[:4] == b"\x89PNG"
    assert page.elsewhere == []  # offline: nothing but the server was asked


def check_before_after(rows, before: np.ndarray, after: np.ndarray) -> None:
    """Each row of a before-and-after table holds the two distributions' probabilities."""
    for i in range(rows.count()):
        token = int(rows.nth(i).get_attribute("data-id"))
        assert float(rows.nth(i).get_attribute("data-before")) == pytest.approx(
            before[token], abs=1e-6
        )
        assert float(rows.nth(i).get_attribute("data-after")) == pytest.approx(
            after[token], abs=1e-6
        )


def softmax(logits: np.ndarray) -> np.ndarray:
    e = np.exp(logits.astype(np.float64) - logits.max())
    return e / e.sum()


def test_the_logit_lens_grid_and_heads_switched_off_show_the_servers_numbers(
    page, server, client, tmp_path
):
    expected = client.encode(TEXT, logit_lens={"top_k": 5}, return_tokens=True)[0]
    lens, t = expected.logit_lens, len(expected.token_ids)
    page.goto(f"{server.http_url}/?text={quote(TEXT)}")
    page.locator('#ablation[data-ready="true"]').wait_for()
    assert page.locator("#lens td").count() == (SMALL_CONFIG.n_layers + 1) * t
    for layer, position in [(0, 0), (1, 5), (2, t - 1)]:
        cell = page.locator(f'#lens td[data-layer="{layer}"][data-position="{position}"]')
        assert int(cell.get_attribute("data-id")) == lens.top_ids[layer, position, 0]
        assert cell.text_content() == lens.top_tokens[layer, position, 0]
        probability = float(cell.get_attribute("data-probability"))
        assert probability == pytest.approx(lens.top_probabilities[layer, position, 0], abs=1e-6)
    # hovering a cell says its top five
    page.locator(f'#lens td[data-layer="1"][data-position="{t - 1}"]').hover()
    info = page.locator("#lens-info[data-top]")
    info.wait_for()
    assert info.get_attribute("data-top") == str(lens.top_ids[1, t - 1].tolist()).replace(" ", "")
    assert f"state 1, after {t - 1}" in info.text_content()

    # two heads off: the distribution after the last token, before and after, as the API says
    page.locator('#switches td[data-layer="1"][data-head="3"]').click()
    page.locator('#switches td[data-layer="1"][data-head="3"].off').wait_for()
    page.locator('#ablation[data-ready="true"][data-off="[[1,3]]"]').wait_for()
    page.locator('#switches td[data-layer="0"][data-head="1"]').click()
    page.locator('#ablation[data-ready="true"][data-off="[[0,1],[1,3]]"]').wait_for()
    off = {(0, 1): 0.0, (1, 3): 0.0}
    after = client.encode(TEXT, head_mask=off, predictions={"positions": [-1], "logits": True})
    before = client.encode(TEXT, predictions={"positions": [-1], "logits": True})
    p_after = softmax(after[0].predictions.logits[0, 0])
    p_before = softmax(before[0].predictions.logits[0, 0])
    rows = page.locator("#ablation tr[data-id]")
    assert rows.count() >= 10
    for i in range(rows.count()):
        token = int(rows.nth(i).get_attribute("data-id"))
        assert float(rows.nth(i).get_attribute("data-before")) == pytest.approx(p_before[token])
        assert float(rows.nth(i).get_attribute("data-after")) == pytest.approx(p_after[token])
    assert int(rows.nth(0).get_attribute("data-id")) == int(np.argmax(p_before))
    assert np.abs(p_after / p_before - 1).max() > 0.01  # the heads mattered (random weights)
    page.screenshot(path=str(tmp_path / "explorer-lens.png"), full_page=True)
    assert page.elsewhere == []


def test_a_layers_heads_side_by_side_and_a_click_enlarges_one(page, server, client):
    """Small multiples: every head of the layer, each scaled to its own largest weight;
    clicking one shows it in the map and the URL."""
    expected = client.encode(TEXT, attention=True)[0]
    t = len(expected.token_ids)
    page.goto(f"{server.http_url}/?text={quote(TEXT)}&layer=1&view=mean")
    page.locator("#heatmap[data-rows]").wait_for()
    heads = page.locator("#heads canvas")
    assert heads.count() == SMALL_CONFIG.n_heads
    for head in range(SMALL_CONFIG.n_heads):
        peak = float(heads.nth(head).get_attribute("data-peak"))
        want = expected.attention[1, head][np.tril_indices(t)].max()
        assert peak == pytest.approx(want, abs=2e-3)
    page.locator('#heads canvas[data-head="2"]').click()
    page.locator('#heatmap[data-view="head"]').wait_for()
    assert (page.input_value("#layer"), page.input_value("#head")) == ("1", "2")
    assert "head=2" in page.url and "view=head" in page.url
    assert page.locator('#heads canvas.selected[data-head="2"]').count() == 1
    assert float(page.locator("#scale-max").text_content()) == pytest.approx(
        expected.attention[1, 2][np.tril_indices(t)].max(), abs=2e-3
    )


def test_heads_switched_off_redraw_every_view_and_live_in_the_url(page, server, client, tmp_path):
    """A shared URL with heads off shows the model without them: the maps, the heads side by
    side and the lens are the API's under that head mask; a click puts a head back."""
    off = {(0, 1): 0.0, (0, 3): 0.0}
    ablated = client.encode(TEXT, attention=True, head_mask=off, logit_lens={"top_k": 1})[0]
    plain = client.encode(TEXT, attention=True)[0]
    page.goto(f"{server.http_url}/?text={quote(TEXT)}&layer=1&head=0&view=head&off=0.1,0.3")
    page.locator('#ablation[data-ready="true"][data-off="[[0,1],[0,3]]"]').wait_for()
    assert page.locator("#switches td.off").count() == 2
    assert "without L0H1, L0H3" in page.locator("#caption-a").text_content()
    # layer 1's attention reads a stream the removed heads no longer write to: at the cell
    # where that moves it most, the page shows the ablated weight, not the plain one
    moved = np.tril(np.abs(ablated.attention[1, 0] - plain.attention[1, 0]))
    row, col = np.unravel_index(np.argmax(moved), moved.shape)
    weight = float(hover_cell(page, row=int(row), col=int(col)).rsplit(" ", 1)[1])
    assert weight == pytest.approx(ablated.attention[1, 0, row, col], abs=1e-3)
    assert moved[row, col] > 4e-3
    small = float(page.locator('#heads canvas[data-head="3"]').get_attribute("data-peak"))
    t = len(ablated.token_ids)
    assert small == pytest.approx(ablated.attention[1, 3][np.tril_indices(t)].max(), abs=2e-3)
    cell = page.locator(f'#lens td[data-layer="2"][data-position="{t - 1}"]')
    assert int(cell.get_attribute("data-id")) == ablated.logit_lens.top_ids[2, t - 1, 0]
    page.screenshot(path=str(tmp_path / "explorer-off.png"), full_page=True)
    # a click puts a head back, in the URL too
    page.locator('#switches td[data-layer="0"][data-head="3"]').click()
    page.locator('#ablation[data-ready="true"][data-off="[[0,1]]"]').wait_for()
    assert "off=0.1" in page.url and "0.3" not in page.url.split("off=")[1]
    assert page.elsewhere == []


def test_the_lens_is_readable_and_follows_a_token_across_the_layers(page, server, client):
    """Dark cells carry white text; a token typed in shows its probability and rank after
    the last position at every state, as the API's lens logits give them."""
    token = "t"  # one byte: one token of the byte tokenizer
    page.goto(f"{server.http_url}/?text={quote(TEXT)}&target={token}")
    table = page.locator('#lens-target[data-ready="true"]')
    table.wait_for()
    assert int(table.get_attribute("data-id")) == ord(token)
    lens = client.encode(TEXT, logit_lens={"positions": [-1], "logits": True})[0].logit_lens
    rows = page.locator("#lens-target tr[data-layer]")
    assert rows.count() == SMALL_CONFIG.n_layers + 1
    for state in range(SMALL_CONFIG.n_layers + 1):
        logits = lens.logits[state, 0].astype(np.float64)
        probability = softmax(logits)[ord(token)]
        rank = 1 + int((logits > logits[ord(token)]).sum())
        row = rows.nth(state)
        assert float(row.get_attribute("data-probability")) == pytest.approx(probability, rel=1e-4)
        assert int(row.get_attribute("data-rank")) == rank
    # a text of two tokens is refused, naming them
    page.fill("#target", "th")
    page.click("#target-form button")
    note = page.locator("#target-note")
    note.wait_for()
    page.wait_for_function("document.getElementById('target-note').textContent.length > 0")
    assert note.text_content() == '"th" is 2 tokens ("t", "h"), not one'


def test_the_lens_grid_is_readable_on_a_trained_model(browser, default_export):
    """The default model is trained: its later layers are confident, their cells dark, and
    their text white; the rest dark text on light cells."""
    served = ServerThread(default_export[0])
    context = browser.new_context(viewport={"width": 1400, "height": 1400})
    try:
        page = context.new_page()
        page.goto(f"{served.http_url}/?text={quote('The cat sat on the mat.')}")
        page.locator('#ablation[data-ready="true"]').wait_for()
        colours = page.eval_on_selector_all(
            "#lens td",
            "tds => tds.map(td => [Number(td.dataset.probability), getComputedStyle(td).color])",
        )
        dark = [colour for probability, colour in colours if probability > 0.5]
        light = [colour for probability, colour in colours if probability <= 0.5]
        assert dark and light  # both kinds of cell, so both rules are tried
        assert set(dark) == {"rgb(255, 255, 255)"} and "rgb(255, 255, 255)" not in light
    finally:
        context.close()
        served.stop()


def test_a_model_without_the_lens_says_so_and_still_shows_attention(
    browser, small_model_dir, tmp_path
):
    from attnserve.model.artifacts import LENS_ONNX_FILENAME, READOUTS_ONNX_FILENAME

    model_dir = tmp_path / "model"
    shutil.copytree(small_model_dir, model_dir)
    for name in (LENS_ONNX_FILENAME, READOUTS_ONNX_FILENAME):
        (model_dir / name).unlink()
    old = ServerThread(model_dir)
    context = browser.new_context()
    try:
        page = context.new_page()
        page.goto(f"{old.http_url}/?text={quote(TEXT)}")
        page.locator("#heatmap[data-rows]").wait_for()
        note = page.locator("#lens-note:not([hidden])")
        note.wait_for()
        assert "No logit lens for" in note.text_content()
        assert "re-export it with `attnserve export`" in note.text_content()
        assert page.locator("#lens-section").is_hidden()
    finally:
        context.close()
        old.stop()


def test_typing_a_text_and_pressing_show(page, server):
    page.goto(server.http_url + "/")
    page.fill("#text", "Hello, world")
    page.click("#show")
    page.locator('#heatmap[data-rows="13"]').wait_for()  # <bos> + 12 bytes
    assert "text=Hello%2C+world" in page.url
    assert page.locator("#status").text_content().startswith("13 tokens")


def test_a_server_with_a_token_lets_the_page_ask_for_it(browser, small_model_dir, small_runtime):
    secured = ServerThread(small_model_dir, small_runtime, auth_token="s3cret")
    context = browser.new_context(viewport={"width": 1400, "height": 1400})
    page = context.new_page()
    status = "document.getElementById('status').textContent"
    try:
        page.goto(f"{secured.http_url}/?text={quote(TEXT)}")
        page.locator("#auth:not([hidden])").wait_for()  # refused: the page asks
        assert "needs its bearer token" in page.locator("#status").text_content()
        page.fill("#token", "wrong")
        page.click("#sign-in")
        page.wait_for_function(f"{status}.includes('That token was refused')")
        page.fill("#token", "s3cret")
        page.click("#sign-in")
        page.locator("#heatmap[data-rows]").wait_for()  # the API answered with the token
        assert page.locator("#auth").is_hidden()
        assert page.locator("#model").text_content() == SMALL_CONFIG.name
        assert page.evaluate("sessionStorage.getItem('attnserve-token')") == "s3cret"
        assert "s3cret" not in page.url  # never in the URL, which is shared
    finally:
        context.close()
        secured.stop()


def test_grouped_query_heads_show_the_key_value_head_they_read(browser, families):
    """Llama with 7 query heads on 1 KV head: every head is labelled with its KV group."""
    grouped = ServerThread(families.exported("llama"))
    context = browser.new_context(viewport={"width": 1400, "height": 1400})
    page = context.new_page()
    try:
        page.goto(f"{grouped.http_url}/?text={quote(TEXT)}&head=6")
        page.locator("#heatmap[data-rows]").wait_for()
        shape = page.locator("#model-shape").text_content()
        assert shape == "2 layers, 7 heads, 1 KV head (grouped-query)"
        labels = page.locator("#head option").all_text_contents()
        assert labels == [f"{h} (kv 0)" for h in range(7)]
        assert page.input_value("#head") == "6"
        kv_row = page.locator("#entropy tr").nth(1).locator("th").all_text_contents()
        assert kv_row == ["kv"] + ["0"] * 7
        assert page.locator("#entropy td").count() == 2 * 7
    finally:
        context.close()
        grouped.stop()


def test_a_model_without_grouping_shows_no_kv_labels(page, server):
    page.goto(f"{server.http_url}/?text={quote(TEXT)}")
    page.locator("#heatmap[data-rows]").wait_for()
    assert page.locator("#model-shape").text_content() == "2 layers, 4 heads"
    assert page.locator("#head option").all_text_contents() == ["0", "1", "2", "3"]


def test_the_api_docs_render_offline(page, server):
    """/docs is Swagger UI from an installed package: it renders the server's OpenAPI
    document and asks nothing of any other host (FastAPI's default loads a CDN)."""
    page.goto(f"{server.http_url}/docs")
    page.locator(".swagger-ui .info .title", has_text="attnserve").wait_for()
    page.locator("#operations-openai-embeddings_v1_embeddings_post").wait_for()
    assert page.elsewhere == []


def head_weights(server, model: str, text: str, layer: int, head: int) -> np.ndarray:
    with EncoderClient(server.address) as client:
        out = client.encode(text, attention=True, layers=[layer], heads=[head], model=model)
    return out[0].attention[0, 0]


def test_two_models_side_by_side_with_their_difference(browser, two_models):
    """The same text through a and b: one layer and head in both maps, hovering names both
    weights and their difference, and the URL carries the comparison."""
    context = browser.new_context(viewport={"width": 1600, "height": 1000})
    page = context.new_page()
    try:
        query = f"text={quote(TEXT)}&model=a&compare=model&model_b=b&layer=0&head=1&view=head"
        page.goto(f"{two_models.http_url}/?{query}")
        page.locator("#pane-diff:not([hidden]) #heatmap-diff[data-rows]").wait_for()
        assert page.locator("#model-a").input_value() == "a"
        assert page.locator("#model-b").input_value() == "b"
        assert "b:" in page.locator("#caption-b").text_content()
        first = head_weights(two_models, "a", TEXT, 0, 1)
        second = head_weights(two_models, "b", TEXT, 0, 1)
        hover_cell(page, 5, 2)
        info = page.locator("#hover-info")
        shown = {k: float(info.get_attribute(f"data-{k}")) for k in ("a", "b", "diff")}
        assert shown["a"] == pytest.approx(first[5, 2], abs=2e-3)
        assert shown["b"] == pytest.approx(second[5, 2], abs=2e-3)
        assert shown["diff"] == pytest.approx(shown["a"] - shown["b"], abs=1e-6)
        # Layer 1 exists in a only: b says so and there is no difference map.
        page.select_option("#layer", "1")
        page.locator("#pane-diff[hidden]").wait_for(state="attached")
        assert "no such layer" in page.locator("#caption-b").text_content()
        assert "compare=model" in page.url and "model_b=b" in page.url and "layer=1" in page.url
    finally:
        context.close()


def test_two_texts_through_one_model_and_the_model_picker(browser, two_models):
    """Two texts of different lengths: both maps, and a note instead of a difference map;
    the picker switches the first model."""
    context = browser.new_context(viewport={"width": 1600, "height": 1000})
    page = context.new_page()
    try:
        other = "A much longer sentence than the first one."
        query = f"text={quote(TEXT)}&model=a&compare=text&text_b={quote(other)}"
        page.goto(f"{two_models.http_url}/?{query}")
        page.locator("#heatmap-b[data-rows]").wait_for()
        note = page.locator("#diff-note:not([hidden])")
        note.wait_for()
        with EncoderClient(two_models.address) as client:
            lengths = [len(client.encode(t, model="a")[0].token_ids) for t in (TEXT, other)]
        assert f"the first has {lengths[0]} tokens, the second {lengths[1]}" in note.text_content()
        assert page.locator("#text-b").input_value() == other
        page.select_option("#model-a", "b")
        page.wait_for_function("document.getElementById('caption-a').textContent.startsWith('b:')")
        shape = page.locator("#model-shape").text_content()
        assert shape.startswith(f"{OTHER_CONFIG.n_layers} layers, {OTHER_CONFIG.n_heads} heads")
        assert "model=b" in page.url
    finally:
        context.close()


def test_each_tokens_features_and_one_feature_across_the_text(browser, small_model_dir, tmp_path):
    """With an SAE beside the model: each token's strongest features as bars under it,
    and a click follows one feature across the text; the numbers are the API's, the URL
    carries the feature."""
    from attnserve.client import ClientOptions
    from attnserve.export.sae import add_sae
    from tests.conftest import linked_copy
    from tests.export.test_sae import saelens_sae

    model_dir = linked_copy(small_model_dir, tmp_path / "model")
    hook = f"blocks.{SMALL_CONFIG.n_layers - 1}.hook_resid_post"
    _, source = saelens_sae(tmp_path, "jumprelu", hook=hook, threshold=2.0)
    add_sae(model_dir, source, name="resid", log=lambda _: None)
    server = ServerThread(model_dir)
    context = browser.new_context(viewport={"width": 1400, "height": 1400})
    page = context.new_page()
    try:
        with EncoderClient(server.address, ClientOptions(timeout_s=60)) as client:
            want = client.encode(TEXT, features={"saes": ["resid"], "top_k": 5})[0].features
            page.goto(f"{server.http_url}/?text={quote(TEXT)}")
            page.locator('#features-section[data-ready="true"]').wait_for()
            assert "jumprelu, 96 features on " + hook in page.locator("#sae-info").text_content()
            t = want.top_ids.shape[1]
            assert page.locator(".feature-token").count() == t
            for position in range(t):
                bars = page.locator(f'.feature-token[data-position="{position}"] .feature')
                ids = [int(bars.nth(i).get_attribute("data-id")) for i in range(bars.count())]
                assert ids == [i for i in want.top_ids[0, position] if i >= 0]
                for i in range(bars.count()):
                    got = float(bars.nth(i).get_attribute("data-activation"))
                    assert got == pytest.approx(want.top_activations[0, position, i], rel=1e-6)
            feature = int(want.top_ids[0, t - 1, 0])
            page.locator(f'.feature-token[data-position="{t - 1}"] .feature').first.click()
            trace = page.locator(f'#feature-trace[data-ready="true"][data-feature="{feature}"]')
            trace.wait_for()
            options = {"saes": ["resid"], "feature_ids": [feature]}
            values = client.encode(TEXT, features=options)[0].features.feature_activations
            cells = page.locator("#feature-trace .trace-token")
            got = [float(cells.nth(p).get_attribute("data-activation")) for p in range(t)]
            np.testing.assert_allclose(got, values[0, :, 0], rtol=1e-6)
            assert f"feature={feature}" in page.url and "sae=resid" in page.url
            # the steering box, by that feature: the API's distributions before and after
            page.select_option("#steer-kind", "feature")
            page.select_option("#steer-sae", "resid")
            page.fill("#steer-feature-id", str(feature))
            page.fill("#steer-strength", "6")
            page.click("#steer-form button")
            page.locator('#steering[data-ready="true"][data-kind="feature"]').wait_for()
            steer = {"op": "add", "feature": {"sae": "resid", "feature_id": feature}, "scale": 6}
            asked = {"positions": [-1], "logits": True}
            before, after = (
                softmax(
                    client.encode(TEXT, interventions=i, predictions=asked)[0].predictions.logits[
                        0, 0
                    ]
                )
                for i in ([], [steer])
            )
            check_before_after(page.locator("#steering tr[data-id]"), before, after)
            assert np.abs(after - before).max() > 1e-4
        page.goto(page.url)  # the shared URL shows the same feature followed
        page.locator(f'#feature-trace[data-ready="true"][data-feature="{feature}"]').wait_for()
    finally:
        context.close()
        server.stop()


def test_a_patching_grid_and_a_steering_box_show_the_servers_numbers(page, server, client):
    """Patch: a cell per layer and token (per layer and head for z), each the API's logit
    difference; steer: the next-token distribution before and after adding the difference
    of two texts' residual streams, and the text continued with it and without, as the API
    gives them."""
    clean = "The dog sat on the mat."
    page.goto(f"{server.http_url}/?text={quote(TEXT)}")
    page.locator('#ablation[data-ready="true"]').wait_for()
    page.fill("#patch-clean", clean)
    page.fill("#patch-corrupted", TEXT)
    page.fill("#patch-answer", "d")
    page.fill("#patch-contrast", "c")
    for hook, columns in (("resid_pre", len(TEXT) + 1), ("z", SMALL_CONFIG.n_heads)):
        page.select_option("#patch-hook", hook)
        page.click("#patch-form button")
        page.locator(f'#patching[data-ready="true"][data-hook="{hook}"]').wait_for()
        asked = {"source": clean, "hook": hook, "target": "d", "contrast": "c"}
        want = client.encode(TEXT, patching=asked)[0].patching
        cells = page.locator("#patching td[data-layer]")
        assert cells.count() == SMALL_CONFIG.n_layers * columns == want.values.size
        for i in range(cells.count()):
            cell = cells.nth(i)
            layer, column = (
                int(cell.get_attribute("data-layer")),
                int(cell.get_attribute("data-column")),
            )
            assert float(cell.get_attribute("data-value")) == pytest.approx(
                want.values[layer, column], abs=1e-5
            )
            assert float(cell.get_attribute("data-recovered")) == pytest.approx(
                want.recovered()[layer, column], abs=1e-4
            )
    page.select_option("#steer-layer", "1")
    page.fill("#steer-strength", "3")
    page.click("#steer-form button")
    page.locator('#steering[data-ready="true"]').wait_for()
    hook = "blocks.1.hook_resid_pre"
    plus, minus = (  # the two texts' mean residual stream
        client.encode(page.input_value(box), capture=[hook])[0].activations[hook].mean(axis=0)
        for box in ("#steer-plus", "#steer-minus")
    )
    steer = [{"hook": hook, "op": "add", "values": plus - minus, "scale": 3.0}]
    before, after = (
        softmax(
            client.encode(TEXT, interventions=i, predictions={"positions": [-1], "logits": True})[
                0
            ].predictions.logits[0, 0]
        )
        for i in ([], steer)
    )
    rows = page.locator("#steering tr[data-id]")
    assert rows.count() >= 10
    check_before_after(rows, before, after)
    assert np.abs(after - before).max() > 1e-3  # the direction moved the distribution
    # the text continued with the direction at every token it writes, and without
    page.locator('#continuations[data-ready="true"]').wait_for()
    options = dict(max_tokens=24, temperature=0, interventions=steer, compare=True)
    texts = ["", ""]
    for token in client.generate(TEXT, **options):
        texts[token.choice] += token.text
    assert page.text_content("#steered-text") == texts[0]
    assert page.text_content("#plain-text") == texts[1]
    # its whitespace marked as the lens marks it, the text unchanged
    marks = page.locator("#plain-text .ws").evaluate_all("s => s.map(x => x.dataset.mark)")
    blanks = [c for c in texts[1] if c in " \t\n"]
    assert marks == [{" ": "\u2423", "\t": "\u21e5", "\n": "\u21b5"}[c] for c in blanks]
    assert page.elsewhere == []


def test_the_defaults_steer_and_patch_the_default_model(browser, default_export):
    """As a newcomer finds the page on the default model: Steer and Patch with nothing
    changed. The steering moves the next-token distribution and the continued text; the
    patching pair's answer moves (clean and corrupted 1.0 apart or more, no warning), and
    its attribution estimate and saliency are the API's."""
    served = ServerThread(default_export[0])
    context = browser.new_context()
    page = context.new_page()
    try:
        page.goto(f"{served.http_url}/?text={quote('The cat sat on the mat.')}")
        page.locator('#ablation[data-ready="true"]').wait_for()
        assert page.input_value("#steer-layer") == "2"  # a middle layer of four
        page.click("#steer-form button")
        page.locator('#steering[data-ready="true"]').wait_for()
        before = [float(x) for x in page.locator("#steering tr[data-id]").evaluate_all(
            "rows => rows.map(r => r.dataset.before)")]  # fmt: skip
        after = [float(x) for x in page.locator("#steering tr[data-id]").evaluate_all(
            "rows => rows.map(r => r.dataset.after)")]  # fmt: skip
        assert max(abs(a - b) for a, b in zip(after, before, strict=True)) > 0.01
        page.locator('#continuations[data-ready="true"]').wait_for()
        plain = page.text_content("#plain-text")
        assert page.text_content("#steered-text") != plain
        # generated whitespace shows: a mark on each space, tab and line end
        marks = page.locator("#plain-text .ws").evaluate_all("s => s.map(x => x.dataset.mark)")
        assert len(marks) == sum(c in " \t\n" for c in plain) > 0
        page.click("#patch-form button")
        grid = page.locator('#patching[data-ready="true"]')
        grid.wait_for()
        clean, corrupted = (float(grid.get_attribute(f"data-{k}")) for k in ("clean", "corrupted"))
        assert clean - corrupted >= 1.0 and grid.get_attribute("data-warning") == ""
        assert page.locator("#saliency").is_hidden()  # the runs give no gradient
        # the attribution method: the server's estimate in each cell, each token's saliency
        # below, the bracket (the one token that differs) the most salient
        page.select_option("#patch-method", "PATCHING_METHOD_ATTRIBUTION")
        page.click("#patch-form button")
        page.locator(
            '#patching[data-ready="true"][data-method="PATCHING_METHOD_ATTRIBUTION"]'
        ).wait_for()
        asked = {"source": page.input_value("#patch-clean"), "hook": "resid_pre",
                 "target": "]", "contrast": ")", "method": "attribution"}  # fmt: skip
        with EncoderClient(served.address) as client:
            want = client.encode(page.input_value("#patch-corrupted"), patching=asked)[0].patching
        shown = page.locator("#patching td[data-layer]").evaluate_all(
            "cells => cells.map(c => [+c.dataset.layer, +c.dataset.column, +c.dataset.value])"
        )
        assert len(shown) == want.values.size
        for layer, column, value in shown:
            assert value == pytest.approx(want.values[layer, column], abs=1e-5)
        saliency = page.locator("#saliency td[data-position]").evaluate_all(
            "cells => cells.map(c => +c.dataset.value)"
        )
        np.testing.assert_allclose(saliency, want.saliency, rtol=0, atol=1e-5)
        assert int(np.abs(saliency).argmax()) == 5  # BOS, "x", " ", "=", " ", "("
    finally:
        context.close()
        served.stop()


LONG_TEXT = "In the beginning the cat sat on the mat, and then the dog came. " * 4  # 256 tokens


def test_the_long_view_says_where_the_context_cut_the_text_and_wraps_it(page, server):
    """A text past the model's context: the long view says that it shows the first
    max_seq_len tokens and where the text was cut; a run with no space in it wraps inside
    the box instead of running off the page."""
    text = "=" * 150 + " " + "x" * (SMALL_CONFIG.max_seq_len)
    page.goto(f"{server.http_url}/?text={quote(text)}&view=long&layer=0&head=0")
    page.locator('#long-tokens[data-ready="true"]').wait_for()
    cut = page.locator("#long-cut")
    assert cut.is_visible()
    assert f"first {SMALL_CONFIG.max_seq_len} tokens" in cut.text_content()
    assert page.locator("#long-tokens span").count() == SMALL_CONFIG.max_seq_len
    overflow = page.locator("#long-tokens").evaluate("box => box.scrollWidth - box.clientWidth")
    assert overflow <= 0
    page.goto(f"{server.http_url}/?text={quote('short')}&view=long&layer=0&head=0")
    page.locator('#long-tokens[data-ready="true"]').wait_for()
    assert page.locator("#long-cut").is_hidden()


def test_a_long_text_shows_received_attention_top_keys_and_exact_tiles(page, server, client):
    """The long view never asks for a map: each token shaded by the attention it receives,
    a row's top keys on hover, and tiles of the map that are the API's full weights there
    (this model's maps fit, so the test can hold the whole map against them)."""
    layer, head = 1, 2
    page.goto(f"{server.http_url}/?text={quote(LONG_TEXT)}&view=long&layer={layer}&head={head}")
    page.locator('#long-tokens[data-ready="true"]').wait_for()
    page.locator('#long-tile[data-ready="true"]').wait_for()
    assert page.locator("#maps").is_hidden()
    (stats,) = client.encode(
        LONG_TEXT, layers=[layer], heads=[head], top_k=8, received=True, row_entropy=True
    )
    (full,) = client.encode(LONG_TEXT, layers=[layer], heads=[head])
    t = len(stats.token_ids)
    spans = page.locator("#long-tokens span")
    assert spans.count() == t >= 256
    shown = np.array([float(spans.nth(i).get_attribute("data-received")) for i in range(t)])
    assert np.abs(shown - stats.attention_received[0, 0]).max() <= 1e-6
    assert np.abs(shown - full.attention[0, 0].sum(0)).max() <= 1e-4  # the map's column sums
    for row in (0, 100, t - 1):
        spans.nth(row).hover()
        info = page.locator(f'#long-top[data-row="{row}"]')
        info.wait_for()
        keys = [int(k) for k in info.get_attribute("data-keys").split(",")]
        assert keys == [int(k) for k in stats.indices[0, 0, row] if k >= 0]
        assert page.locator("#long-tokens span.key").count() == len(set(keys))

    def hover_tile(i: int, j: int) -> tuple[int, int, float]:
        canvas = page.locator("#long-tile")
        canvas.scroll_into_view_if_needed()
        box = canvas.bounding_box()
        cell = box["width"] / 128
        page.mouse.move(box["x"] + (j + 0.5) * cell, box["y"] + (i + 0.5) * cell)
        info = page.locator("#long-tile-info")
        r0, k0 = (int(canvas.get_attribute(f"data-{k}")) for k in ("r0", "k0"))
        page.locator(f'#long-tile-info[data-row="{r0 + i}"][data-key="{k0 + j}"]').wait_for()
        return r0 + i, k0 + j, float(info.get_attribute("data-value"))

    # the first tile: the last 128 rows against the first 128 keys
    assert page.locator("#long-tile").get_attribute("data-r0") == str(t - 128)
    for i, j in ((0, 0), (5, 100), (127, 127)):
        row, key, value = hover_tile(i, j)
        assert value == pytest.approx(full.attention[0, 0, row, key], abs=1e-6)
    # a click on the overview zooms there: rows and keys around the point, clamped
    overview = page.locator("#long-overview")
    overview.scroll_into_view_if_needed()
    box = overview.bounding_box()
    page.mouse.click(box["x"] + box["width"] * 0.6, box["y"] + box["height"] * 0.7)
    page.locator('#long-tile[data-ready="true"]:not([data-k0="0"])').wait_for()
    tile = page.locator("#long-tile")
    r0, k0 = (int(tile.get_attribute(f"data-{k}")) for k in ("r0", "k0"))
    assert abs(r0 - (int(0.7 * t) - 64)) <= 1 and abs(k0 - (int(0.6 * t) - 64)) <= 1
    for i, j in ((0, 0), (40, 60), (127, 127)):
        row, key, value = hover_tile(i, j)
        assert value == pytest.approx(full.attention[0, 0, row, key], abs=1e-6)
    assert not page.elsewhere


def test_an_attribution_graph_drawn_as_the_api_answers_it(browser, default_export):
    """The default model's graph with its shipped transcoders: as many features, errors,
    tokens and links as POST /v1/graph answers; hovering a feature names its activation and
    the token its decoder raises most; a slider prunes again at its threshold."""
    served = ServerThread(default_export[0])
    context = browser.new_context(viewport={"width": 1400, "height": 1400})
    page = context.new_page()
    elsewhere: list[str] = []
    page.on("request", lambda r: r.url.startswith(served.http_url) or elsewhere.append(r.url))
    body = {"prompt": TEXT, "transcoders": "plt", "max_feature_nodes": 64, "top_logits": 5}

    def answered(node_threshold: float) -> dict:
        asked = body | {"node_threshold": node_threshold}
        return httpx.post(f"{served.http_url}/v1/graph", json=asked, timeout=600).json()

    try:
        page.goto(f"{served.http_url}/?text={quote(TEXT)}")
        page.locator('#ablation[data-ready="true"]').wait_for()
        assert page.input_value("#graph-set") == "plt"
        page.click("#graph-form button")
        page.locator('#graph-section[data-ready="true"]').wait_for(timeout=600_000)
        graph = answered(0.8)
        kinds = [node["feature_type"] for node in graph["nodes"]]
        assert page.locator("#graph circle").count() == kinds.count("cross layer transcoder") > 0
        assert page.locator("#graph rect").count() == kinds.count("mlp reconstruction error")
        tokens = page.locator("#graph text.embedding").all_text_contents()
        assert tokens == graph["metadata"]["prompt_tokens"]  # the special token first
        assert page.locator("#graph text.logit").count() == kinds.count("logit") > 0
        assert page.locator("#graph line").count() == len(graph["links"]) > 0
        feature = next(n for n in graph["nodes"] if n["feature_type"] == "cross layer transcoder")
        page.hover(f'#graph circle[data-id="{feature["node_id"]}"]')
        info = page.text_content("#graph-info")
        assert f"activation {feature['activation']:.3f}" in info
        raised = graph["feature_logits"][feature["jsNodeId"]][0]
        assert (
            f"raises {json.dumps(raised['token'], ensure_ascii=False)} {raised['logit']:.2f}"
            in info
        )
        pruned = answered(0.5)
        assert len(pruned["nodes"]) < len(graph["nodes"])
        page.locator("#graph-node-threshold").evaluate(
            "s => { s.value = '0.5'; s.dispatchEvent(new Event('change')); }"
        )
        n = len(pruned["nodes"])
        page.locator(f'#graph-section[data-ready="true"][data-nodes="{n}"]').wait_for(
            timeout=600_000
        )
        assert page.locator("#graph line").count() == len(pruned["links"])
        assert elsewhere == []
    finally:
        context.close()
        served.stop()
