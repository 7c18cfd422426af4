"""`attnserve serve` and the client commands as a user runs them: two real processes."""

import json
import socket

import numpy as np

from attnserve.client import ClientOptions, EncoderClient, build_request
from tests.conftest import REPO_ROOT, run_cli


def test_subprocess_server_answers_all_three_rpcs(cli_server, small_runtime):
    with EncoderClient(cli_server.address, ClientOptions(timeout_s=60)) as c:
        assert c.model_info()["version"] == small_runtime.version
        out = c.encode([[5, 6, 7, 8]], attention=True)
        embeddings, attentions = small_runtime.run(np.array([[5, 6, 7, 8]]))
        np.testing.assert_allclose(out[0].embeddings, embeddings[0], atol=1e-5)
        np.testing.assert_allclose(out[0].attention, attentions[0], atol=1e-5)
        streamed = list(c.encode_stream([build_request([[5, 6, 7, 8]], request_id="s")]))
        assert streamed[0].request_id == "s"
        assert list(streamed[0].response.results[0].token_ids) == [5, 6, 7, 8]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_health_exit_code_follows_the_health_service(cli_server):
    serving = run_cli("health", "--target", cli_server.address)
    assert (serving.returncode, serving.stdout.strip()) == (0, "SERVING")
    unknown = run_cli("health", "--target", cli_server.address, "--service", "x")
    assert unknown.returncode == 1 and "NOT_FOUND" in unknown.stderr
    nobody = run_cli("health", "--target", f"127.0.0.1:{_free_port()}", "--timeout", "1")
    assert nobody.returncode == 1
    assert "UNAVAILABLE" in nobody.stderr or "DEADLINE_EXCEEDED" in nobody.stderr


def test_info(cli_server):
    result = run_cli("info", "--target", cli_server.address)
    assert result.returncode == 0, result.stderr
    info = json.loads(result.stdout)
    assert info["n_layers"] == 2 and info["tokenizer"] == "byte"
    # Numbers print as numbers (int64 included) and the config as an object, not a string.
    assert info["max_message_bytes"] == 64 * 2**20 and info["bos_id"] == 257
    assert info["config"]["n_layers"] == 2 and "config_json" not in info
    assert info["kv_heads"] == [0, 1, 2, 3]


def test_encode_summary_and_json(cli_server):
    result = run_cli(
        "encode",
        "--target",
        cli_server.address,
        "--text",
        "hi there",
        "--pooling",
        "mean",
        "--attention",
        "--layers",
        "1",
        "--heads",
        "0",
        "2",
    )
    assert result.returncode == 0, result.stderr
    assert "[0] 9 tokens" in result.stdout
    assert "embeddings (9, 64)" in result.stdout
    assert "pooled (64,)" in result.stdout
    assert "attention (1, 2, 9, 9) for layers [1] heads [0, 2]" in result.stdout

    result = run_cli(
        "encode",
        "--target",
        cli_server.address,
        "--ids",
        "1,2,3",
        "--ids",
        "4,5",
        "--json",
    )
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert [r["token_ids"] for r in data["results"]] == [[1, 2, 3], [4, 5]]
    assert np.array(data["results"][0]["embeddings"]).shape == (3, 64)


def test_errors_are_reported_with_their_status(cli_server):
    result = run_cli("encode", "--target", cli_server.address, "--ids", "1,999")
    assert result.returncode == 1
    assert "INVALID_ARGUMENT" in result.stderr and "token id 999" in result.stderr


def test_a_reader_that_closes_the_pipe_ends_the_command_without_a_traceback(cli_server):
    """`attnserve encode --json | head -c 10`: the answer (far more than a pipe holds) stops
    at the closed pipe with SIGPIPE's status, and nothing on stderr."""
    import subprocess
    import sys

    command = [sys.executable, "-m", "attnserve", "encode", "--target", cli_server.address,
               "--text", "hello there " * 20, "--attention", "--json"]  # fmt: skip
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO_ROOT
    )
    assert process.stdout is not None and process.stderr is not None
    assert process.stdout.read(10)
    process.stdout.close()  # what head does once it has its bytes
    assert process.wait(60) == 141
    assert process.stderr.read() == b""


def test_heatmap_writes_a_png(cli_server, tmp_path):
    out = tmp_path / "attention.png"
    result = run_cli(
        "heatmap",
        "--target",
        cli_server.address,
        "--text",
        "The cat sat on the mat.",
        "--layer",
        "1",
        "--head",
        "3",
        "--out",
        str(out),
    )
    assert result.returncode == 0, result.stderr
    assert "24 tokens, layer 1, head 3" in result.stdout
    header = out.read_bytes()[:8]
    assert header == b"\x89PNG\r\n\x1a\n"
    assert out.stat().st_size > 10_000


def test_encode_with_attention_options_as_json(cli_server, small_runtime):
    ids = [5, 6, 7, 8, 9]
    result = run_cli(
        "encode", "--target", cli_server.address, "--ids", ",".join(map(str, ids)),
        "--rows", "-1", "--top-k", "2", "--entropy", "--json",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    answer = json.loads(result.stdout)["results"][0]
    weights = small_runtime.run(np.array([ids]))[1][0]  # (L, H, T, T)
    last = weights[:, :, 4]  # (L, H, T)
    order = np.argsort(-last, axis=-1)[..., :2]
    assert answer["attention_rows"] == [4]
    np.testing.assert_array_equal(np.array(answer["attention_indices"])[:, :, 0], order)
    np.testing.assert_allclose(
        np.array(answer["attention"])[:, :, 0], np.take_along_axis(last, order, -1), atol=2e-5
    )
    assert np.array(answer["head_entropy"]).shape == weights.shape[:2]


def test_heatmap_of_a_rollout_a_head_mean_and_the_entropy_grid(cli_server, tmp_path):
    pictures = {
        "rollout": (["--rollout", "--rows", "-3", "-2", "-1"], "3 x 24 tokens, rollout over all"),
        "mean": (["--layer", "1", "--head-reduction", "mean"], "layer 1, mean of its heads"),
        "entropy": (["--entropy"], "(2 layers x 4 heads)"),
    }
    for name, (flags, says) in pictures.items():
        out = tmp_path / f"{name}.png"
        result = run_cli(
            "heatmap", "--target", cli_server.address, "--text", "The cat sat on the mat.",
            *flags, "--out", str(out),
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        assert says in result.stdout
        assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_encode_predictions_lens_and_ablation(cli_server):
    args = ("encode", "--target", cli_server.address, "--text", "hi there", "--predict")
    extra = ("--lens", "--hidden-norms", "--target-ids", "104,105", "--top-tokens", "3")
    ablated = ("--ablate", "0:1", "--ablate", "1:3")
    summary = run_cli(*args, *extra, *ablated)
    assert summary.returncode == 0, summary.stderr
    assert "next token after position 8:" in summary.stdout  # <bos> + 8 bytes: the last
    assert "logit lens after position 8:" in summary.stdout
    # predictions and the lens' last layer, without the ablation and with it
    assert summary.stdout.count("layer   2:") == 4 and "layer   0:" in summary.stdout
    assert "hidden-state norms at 8, by layer:" in summary.stdout
    result = json.loads(run_cli(*args, *extra, *ablated, "--json").stdout)["results"][0]
    with EncoderClient(cli_server.address, ClientOptions(timeout_s=60)) as c:
        want = c.encode(
            "hi there",
            predictions={"positions": [-1], "top_k": 3, "target_ids": [104, 105]},
            logit_lens={"positions": [-1], "top_k": 3, "target_ids": [104, 105]},
            head_mask={(0, 1): 0.0, (1, 3): 0.0},
        )[0]
        plain = c.encode("hi there", predictions={"positions": [-1], "top_k": 3})[0]
    assert result["predictions"]["top_ids"] == want.predictions.top_ids.tolist()
    np.testing.assert_allclose(
        result["logit_lens"]["target_probabilities"], want.logit_lens.target_probabilities
    )
    assert result["logit_lens"]["layers"] == [0, 1, 2]
    assert len(result["hidden_state_norms"]) == 3  # layers x one position
    # the ablation reached the server: the prediction is not the unablated one
    assert not np.allclose(
        result["predictions"]["top_probabilities"], plain.predictions.top_probabilities
    )
    bad = run_cli(*args, "--ablate", "0-1")
    assert bad.returncode == 2 and "'0-1' is not LAYER:HEAD" in bad.stderr


def test_encode_attribution(cli_server):
    args = ("encode", "--target", cli_server.address, "--text", "hi there")
    summary = run_cli(*args, "--attribute", "104:105", "--ablate", "0:1")
    assert summary.returncode == 0, summary.stderr
    line = next(s for s in summary.stdout.splitlines() if "logit 'h' (104) - logit 'i' (105)" in s)
    assert "after position 8:" in line and "+ ..." in line  # the six largest of 2 x 6 + 2
    result = json.loads(run_cli(*args, "--attribute", "104", "--attribute", "7", "--json").stdout)
    attribution = result["results"][0]["attribution"]
    with EncoderClient(cli_server.address, ClientOptions(timeout_s=60)) as c:
        want = c.encode(
            "hi there",
            attribution={"target_ids": [104, 7], "positions": [-1]},
            predictions={"positions": [-1], "logits": True},
        )[0]
    assert attribution["target_ids"] == [104, 7] and attribution["positions"] == [8]
    np.testing.assert_allclose(attribution["heads"], want.attribution.heads, atol=1e-6)
    np.testing.assert_allclose(
        attribution["total"], want.predictions.logits[0][:, [104, 7]], atol=1e-4
    )
    bad = run_cli(*args, "--attribute", "1:2:3")
    assert bad.returncode == 2 and "'1:2:3' is not TARGET or TARGET:CONTRAST" in bad.stderr


def test_tokens_by_their_text_and_beside_every_id(cli_server):
    """--target-tokens and --attribute take a token's text; ids print with their text."""
    args = ("encode", "--target", cli_server.address, "--text", "hi there", "--predict")
    by_text = run_cli(*args, "--target-tokens", "h", "--attribute", "h:i")
    by_id = run_cli(*args, "--target-ids", "104", "--attribute", "104:105")
    assert by_text.returncode == by_id.returncode == 0, by_text.stderr
    assert "targets 'h' (104) " in by_text.stdout
    assert "logit 'h' (104) - logit 'i' (105) after position 8: " in by_text.stdout
    assert by_text.stdout.splitlines()[1:] == by_id.stdout.splitlines()[1:]  # timings aside
    # a text the tokenizer makes two tokens is refused, naming them
    two = run_cli(*args, "--target-tokens", "hi")
    assert two.returncode == 2
    assert "'hi' is 2 tokens ('h', 'i'), not one: give a single token's text" in two.stderr


def test_ablate_prints_the_run_without_the_ablation_beside_it(cli_server):
    args = ("encode", "--target", cli_server.address, "--text", "hi there", "--predict")
    plain = run_cli(*args, "--target-tokens", "h")
    ablated = run_cli(*args, "--target-tokens", "h", "--ablate", "0:1", "--ablate", "1:3")
    assert plain.returncode == ablated.returncode == 0, ablated.stderr
    lines = ablated.stdout.splitlines()
    before = lines.index("  without the ablation:")
    after = lines.index("  with L0H1, L1H3 removed:")
    # the run without it is the plain run; the run with it differs
    assert lines[before + 1 : after] == plain.stdout.splitlines()[2:]
    assert lines[after + 1 :] != lines[before + 1 : after]


def test_encode_patch_prints_the_grid_with_token_labels(cli_server):
    """--patch CLEAN --answer --contrast: a row per layer, a column per token, each the
    share of the clean difference the patched place brings back (the grid as JSON is the
    client's)."""
    args = ("encode", "--target", cli_server.address, "--text", "Mary gave it")
    asked = ("--patch", "John gave it", "--answer", "M", "--contrast", "J")
    shown = run_cli(*args, *asked)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    head = next(i for i, line in enumerate(lines) if "patching resid_pre:" in line)
    result = json.loads(run_cli(*args, *asked, "--json").stdout)["results"][0]["patching"]
    if abs(result["clean"] - result["corrupted"]) < 1.0:  # a random model's pair: said so
        assert lines[head + 1].split()[0] == "warning:" and result["warning"]
        head += 1
    else:
        assert result["warning"] is None
    assert lines[head + 1].split() == ["<bos>", *"Mary\u2423gave\u2423it"]  # the tokens
    rows = lines[head + 2 : head + 4]
    assert [row.split()[0] for row in rows] == ["L0", "L1"]
    with EncoderClient(cli_server.address, ClientOptions(timeout_s=60)) as c:
        want = c.encode(
            "Mary gave it",
            patching={
                "source": "John gave it",
                "hook": "resid_pre",
                "target": "M",
                "contrast": "J",
            },
        )[0].patching
    np.testing.assert_allclose(result["values"], want.values, atol=1e-6)
    shown_values = np.array([[float(v) for v in row.split()[1:]] for row in rows])
    np.testing.assert_allclose(shown_values, want.recovered(), atol=0.006)
    missing = run_cli(*args, "--patch", "John gave it", "--answer", "M")
    assert missing.returncode == 2 and "--patch needs --answer and --contrast" in missing.stderr
