"""Every upload is checked before aggregation: honest encodings pass, each malformed kind is rejected
with its reason."""

import pytest
import torch

from cosmos_pl.communication import Payload, encode, encode_hard
from cosmos_pl.uploads import RejectedUpload, UploadSpec, check_upload, check_weights, public_fingerprint, row_sum_tolerance

U = torch.arange(2 * 3 * 4 * 4, dtype=torch.uint8).reshape(2, 3, 4, 4)
FP = public_fingerprint(U)
PROBS = torch.tensor([[0.7, 0.2, 0.1], [0.1, 0.1, 0.8]])


def spec(dtype="float32", top_k=None):
    return UploadSpec(public_samples=2, num_classes=3, dtype=dtype, top_k=top_k, fingerprint=FP)


def test_fingerprint_depends_on_content_and_order():
    assert len(FP) == 16 and FP == public_fingerprint(U.clone())
    assert public_fingerprint(U.flip(0)) != FP
    changed = U.clone()
    changed[0, 0, 0, 0] += 1
    assert public_fingerprint(changed) != FP


@pytest.mark.parametrize("dtype,top_k", [("float32", None), ("float16", None), ("uint8", None), ("float32", 2),
                                         ("uint8", 2)])
def test_honest_encodings_pass(dtype, top_k):
    check_upload(encode(PROBS, dtype, top_k, fingerprint=FP), spec(dtype, top_k))


def test_hard_labels_pass_and_out_of_range_is_rejected():
    check_upload(encode_hard(PROBS, fingerprint=FP), spec("index"))
    bad = Payload(torch.tensor([0, 3], dtype=torch.uint8), None, 3, "index", FP)
    with pytest.raises(RejectedUpload, match=r"class indices outside \[0, 3\)"):
        check_upload(bad, spec("index"))


def good(**change):
    fields = dict(values=PROBS.clone(), indices=None, num_classes=3, dtype="float32", public_fingerprint=FP)
    fields.update(change)
    return Payload(**fields)


@pytest.mark.parametrize("payload,reason", [
    (good(values=PROBS[:1]), r"shape \[1, 3\], expected \[2, 3\]"),
    (good(values=PROBS.double()), "dtype torch.float64, expected torch.float32"),
    (good(values=torch.tensor([[float("nan"), 0.5, 0.5], [0.1, 0.1, 0.8]])), "1 values are NaN or inf"),
    (good(values=torch.tensor([[1.2, -0.2, 0.0], [0.1, 0.1, 0.8]])), r"1 values are negative \(min -0.2\)"),
    (good(values=PROBS * 1.5), r"2 rows do not sum to 1 \(max \|sum - 1\| 0.5 > tolerance 0.001\)"),
    (good(public_fingerprint="0" * 16), "fingerprint 0000000000000000 does not match"),
    (good(num_classes=4), "declared M = 4"),
    ("not a payload", "not a pseudo-label payload"),
])
def test_malformed_uploads_are_rejected_with_their_reason(payload, reason):
    with pytest.raises(RejectedUpload, match=reason):
        check_upload(payload, spec())


def test_tolerances_by_hand():
    assert row_sum_tolerance("float32", 100) == 1e-3
    assert row_sum_tolerance("uint8", 100) == pytest.approx(100 / 510 + 1e-3)
    assert row_sum_tolerance("uint8", 100, top_k=5) == pytest.approx(5 / 510 + 1e-3)
    # a row of float32 that sums to 1.0009 passes, 1.0011 does not
    check_upload(good(values=torch.tensor([[0.7009, 0.2, 0.1], [0.1, 0.1, 0.8]])), spec())
    with pytest.raises(RejectedUpload, match="1 rows"):
        check_upload(good(values=torch.tensor([[0.7011, 0.2, 0.1], [0.1, 0.1, 0.8]])), spec())


def test_weights_uploads():
    ref = {"w": torch.zeros(2, 2), "b": torch.zeros(2)}
    check_weights({"w": torch.ones(2, 2), "b": torch.ones(2)}, ref)
    with pytest.raises(RejectedUpload, match="missing"):
        check_weights({"w": torch.ones(2, 2)}, ref)
    with pytest.raises(RejectedUpload, match="w: shape"):
        check_weights({"w": torch.ones(3, 2), "b": torch.ones(2)}, ref)
    with pytest.raises(RejectedUpload, match="b: NaN or inf"):
        check_weights({"w": torch.ones(2, 2), "b": torch.tensor([1.0, float("inf")])}, ref)
