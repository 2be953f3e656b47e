"""Upload encodings: exact byte counts against the formula, and decoding back onto the simplex."""

import pytest
import torch

from cosmos_pl.communication import decode, encode, encode_hard, hard_label_bytes, pseudo_label_bytes, state_dict_bytes


@pytest.fixture
def probs():
    torch.manual_seed(0)
    return torch.softmax(torch.randn(50, 10) * 2, dim=1)


@pytest.mark.parametrize("dtype,top_k,expected", [
    ("float32", None, 50 * 10 * 4),      # n * M * 4
    ("float16", None, 50 * 10 * 2),      # n * M * 2
    ("uint8", None, 50 * 10 * 1),        # n * M * 1
    ("float32", 3, 50 * 3 * (4 + 1)),    # n * k * (4 value + 1 index byte, M <= 256)
    ("float16", 3, 50 * 3 * (2 + 1)),
    ("uint8", 3, 50 * 3 * (1 + 1)),
])
def test_bytes_sent_match_the_formula(probs, dtype, top_k, expected):
    payload = encode(probs, dtype, top_k)
    assert payload.nbytes == expected == pseudo_label_bytes(50, 10, dtype, top_k)


def test_index_bytes_grow_past_256_classes():
    p = torch.softmax(torch.randn(4, 300), dim=1)
    assert encode(p, "float16", 5).nbytes == 4 * 5 * (2 + 2) == pseudo_label_bytes(4, 300, "float16", 5)


def test_decoded_rows_are_on_the_simplex_and_close(probs):
    for dtype, tol in (("float32", 1e-6), ("float16", 2e-3), ("uint8", 1e-2)):
        out = decode(encode(probs, dtype))
        assert torch.allclose(out.sum(1), torch.ones(50), atol=1e-5)
        assert (out - probs).abs().max() <= tol


def test_top_k_by_hand():
    p = torch.tensor([[0.5, 0.3, 0.1, 0.06, 0.04]])
    out = decode(encode(p, "float32", top_k=2))
    # kept .5 and .3; dropped mass .2 spread over the other 3 classes: .0667 each
    assert out[0].tolist() == pytest.approx([0.5, 0.3, 0.2 / 3, 0.2 / 3, 0.2 / 3], abs=1e-6)
    assert torch.equal(decode(encode(p, "float32", top_k=5)), p)


def test_hard_labels_by_hand():
    p = torch.tensor([[0.2, 0.7, 0.1], [0.5, 0.2, 0.3]])
    payload = encode_hard(p)
    assert payload.values.tolist() == [1, 0] and payload.values.dtype == torch.uint8
    assert payload.nbytes == 2 == hard_label_bytes(2, 3)
    assert decode(payload).tolist() == [[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]]
    assert encode_hard(torch.rand(3, 300)).values.dtype == torch.int16 and hard_label_bytes(3, 300) == 6


def test_state_dict_bytes_counts_only_floating_tensors():
    state = {"w": torch.zeros(3, 2), "h": torch.zeros(4, dtype=torch.float16), "n": torch.tensor(7)}
    assert state_dict_bytes(state) == 3 * 2 * 4 + 4 * 2


def test_bad_settings():
    p = torch.full((2, 4), 0.25)
    with pytest.raises(ValueError, match="top_k"):
        encode(p, "float32", top_k=5)
    with pytest.raises(ValueError, match="upload_dtype"):
        encode(p, "int4")


@pytest.mark.slow
def test_fit_counts_compressed_upload_bytes(repo_root, tmp_path):
    import csv
    import json

    from conftest import small_digits_argv
    from cosmos_pl.cli import run

    run_dir = tmp_path / "run"
    summary = run(small_digits_argv(repo_root, run_dir, "--communication.upload_dtype", "uint8",
                                    "--communication.top_k", "3", "--rounds", "1"))
    n = json.loads((run_dir / "partition.json").read_text())["public_set_size"]
    assert summary["communication"]["upload_bytes_per_client_per_round"] == n * 3 * (1 + 1)  # k values + k indices
    assert summary["communication"]["download_bytes_per_client_per_round"] == n * 10 * 4  # dense float32
    with open(run_dir / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    assert int(rows[1]["upload_bytes_per_client"]) == n * 3 * 2
