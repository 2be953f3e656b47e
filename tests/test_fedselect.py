"""FedSelect (Tamirisa et al., CVPR 2024): hand-worked values of its per-index average, its mask growth with the
pinned rounding rule, LocalAlt's frozen entries, its bytes, and its state (docs/algorithms.md, FedSelect)."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from torch import nn

from cosmos_pl.algorithms import FedSelect
from cosmos_pl.algorithms.fedavg import weighted_average
from cosmos_pl.errors import ConfigError
from cosmos_pl.models.selective import Selective
from cosmos_pl.objectives.select import SelectModule, fit_select, grow_count, grow_mask, grow_masks, grows_before
from cosmos_pl.objectives.stage import run_stage
from cosmos_pl.training.config import TrainerConfig
from cosmos_pl.uploads import RejectedUpload, check_weights

CPU = TrainerConfig(accelerator="cpu", channels_last=False)


class Vector(nn.Module):
    """One parameter ``weight`` [4] and one ``bias`` [3]: the section-5 example."""

    def __init__(self, weight: list[float]) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.tensor(weight, dtype=torch.float32))
        self.bias = nn.Parameter(torch.zeros(3))


def client(weight: list[float], mask: list[int]) -> Selective:
    model = Selective(Vector(weight))
    model.mask.weight.copy_(torch.tensor(mask, dtype=torch.uint8))
    return model


def section5_clients() -> list[Selective]:
    return [client([1, 2, 3, 4], [0, 0, 1, 1]), client([3, 4, 5, 6], [0, 1, 0, 1]), client([5, 6, 7, 8], [1, 0, 0, 1])]


# --------------------------------------------------------------------------- the server: per-index average
def test_per_index_mean_over_the_sharers_and_the_merged_clients():
    clients = section5_clients()
    result = FedSelect().server_step(1, {i: c.weights_to_send() for i, c in enumerate(clients)})
    # index 0: clients 1, 2 share -> (1+3)/2 = 2; index 1: clients 1, 3 -> (2+6)/2 = 4; index 2: clients 2, 3 ->
    # (5+7)/2 = 6; index 3: nobody shares it. Client i receives the averages at its own shared entries only.
    assert result.targets[0]["model.weight"].tolist() == [2, 4, 0, 0]
    assert result.targets[1]["model.weight"].tolist() == [2, 0, 6, 0]
    assert result.targets[2]["model.weight"].tolist() == [0, 4, 6, 0]
    # the zero-diluted mean of the COSMOS authors' code ((1+3+0)/3, ...) would give this
    assert not torch.allclose(result.targets[0]["model.weight"][:2], torch.tensor([1.3333, 2.6667]), atol=1e-3)
    for c, i in zip(clients, range(3)):
        c.receive_weights(result.targets[i])
        c.merge_pending(c.masks())
    assert [c.model.weight.tolist() for c in clients] == [[2, 4, 3, 4], [2, 4, 6, 6], [5, 4, 6, 8]]
    assert all(int(c.has_pending) == 0 for c in clients)


def test_receiving_only_stores_the_average_until_the_next_round():
    c = section5_clients()[0]
    c.receive_weights({"model.weight": torch.tensor([9.0, 9, 9, 9]), "model.bias": torch.ones(3)})
    assert c.model.weight.tolist() == [1, 2, 3, 4]  # the evaluation scores the model as training left it
    assert int(c.has_pending) == 1
    with pytest.raises(RuntimeError, match="unexpected server tensor"):
        c.receive_weights({"mask.weight": torch.zeros(4)})


def test_rate_zero_with_equal_sizes_is_fedavg_s_unweighted_mean():
    torch.manual_seed(0)
    clients = [Selective(nn.Linear(5, 3)) for _ in range(3)]
    for c in clients:
        for p in c.model.parameters():
            p.data.normal_()
    uploads = {i: c.weights_to_send() for i, c in enumerate(clients)}
    targets = FedSelect(rate=0.0).server_step(1, uploads).targets
    plain = {i: {k: v for k, v in s.items() if k.startswith("model.")} for i, s in uploads.items()}
    fedavg = weighted_average(plain, {0: 7, 1: 7, 2: 7})
    for i in range(3):
        for key in fedavg:
            torch.testing.assert_close(targets[i][key], fedavg[key], rtol=1e-6, atol=0)
    assert grow_count(100, 0, 0.0, 0.8) == 0  # and rate 0 never makes an entry personal


def test_bad_masks_never_reach_the_average():
    uploads = {i: c.weights_to_send() for i, c in enumerate(section5_clients())}
    reference = Selective(Vector([0, 0, 0, 0])).weights_to_send()
    check_weights(uploads[0], reference)
    uploads[1]["mask.weight"] = torch.tensor([0, 2, 0, 1], dtype=torch.uint8)
    with pytest.raises(RejectedUpload, match="mask.weight: a mask must be uint8 0/1"):
        check_weights(uploads[1], reference)
    with pytest.raises(ValueError, match=r"clients \[1\] sent masks"):
        FedSelect().server_step(1, uploads)


# --------------------------------------------------------------------------- bytes
def test_bytes_are_the_shared_entries_and_a_bit_per_mask_entry():
    clients = section5_clients()
    uploads = {i: c.weights_to_send() for i, c in enumerate(clients)}
    algorithm = FedSelect()
    # client 1: 2 shared weight entries and 3 shared bias entries at 4 bytes, masks of 4 and 3 bits: 1 byte each
    assert algorithm.upload_bytes(0, uploads[0]) == 2 * 4 + 3 * 4 + 1 + 1 == 22
    # down: the averages at a client's shared entries, 2 + 3 for every client here: 20 bytes
    assert algorithm.server_step(1, uploads).download_bytes == 20
    big = Selective(nn.Linear(10, 1, bias=False))  # 10 mask bits: 2 bytes; 10 shared floats: 40 bytes
    assert algorithm.upload_bytes(0, big.weights_to_send()) == 42


# --------------------------------------------------------------------------- mask growth
def test_growth_section5_values():
    mask = torch.zeros(8, dtype=torch.uint8)
    first = grow_mask(mask, torch.tensor([0.1, 0.5, 0.05, 0.3, 0.2, 0, 0.4, 0.01]), 0.25, 0.8)
    assert first.tolist() == [0, 1, 0, 0, 0, 0, 1, 0]  # k = floor(0.25 * 8 + 1/2) = 2: 0.5 and 0.4
    second = grow_mask(first, torch.tensor([0.9, 0.9, 0.2, 0.1, 0.3, 0.05, 0.9, 0.25]), 0.25, 0.8)
    # 6 shared: k = floor(1.5 + 1/2) = 2 (not 1.5): 0.9 at index 0 and 0.3 at index 4
    assert second.tolist() == [1, 1, 0, 0, 1, 0, 1, 0]
    assert mask.tolist() == [0] * 8  # a new tensor


def test_the_rounding_rule_is_half_up_not_numpy_s_half_to_even():
    assert grow_count(10, 0, 0.25, 1.0) == 3  # 2.5 rounds up to 3
    assert int(np.round(0.25 * 10)) == 2  # numpy would take 2
    assert grow_count(2, 0, 0.25, 1.0) == 1  # 0.5 -> 1 (the official cutoff index round(1.5) = 2 overflows)
    assert grow_count(6, 0, 0.25, 1.0) == 2  # 1.5 -> 2 (numpy: 2 as well)
    assert grow_count(100, 0, 0.29, 1.0) == 29  # 28.999... as the decimal setting means


def test_ties_are_taken_in_index_order():
    assert grow_mask(torch.zeros(8, dtype=torch.uint8), torch.zeros(8), 0.25, 0.8).tolist() == [1, 1, 0, 0, 0, 0, 0, 0]
    grid = grow_mask(torch.zeros(2, 3, dtype=torch.uint8), torch.tensor([[1.0, 2, 2], [2, 0, 0]]), 0.5, 1.0)
    assert grid.tolist() == [[0, 1, 1], [1, 0, 0]]  # k = 3: the three 2s, row-major


def test_the_limit_is_never_passed():
    assert grow_count(8, 0, 0.5, 0.4) == 3  # floor(0.4 * 8) = 3 personal at most
    assert grow_count(8, 4, 0.5, 0.5) == 0
    sizes, personal = [], 0
    for _ in range(7):  # p = 0.25, alpha = 0.8 on 10,000 entries: the official code overshoots to 82 %
        personal += grow_count(10_000, personal, 0.25, 0.8)
        sizes.append(personal)
    assert sizes == [2500, 4375, 5781, 6836, 7627, 8000, 8000]


def test_grow_masks_grows_weight_tensors_only_and_moves_the_snapshot():
    model = Selective(Vector([0, 0, 0, 0]))
    with torch.no_grad():
        model.model.weight.copy_(torch.tensor([0.1, -0.9, 0.2, 0.0]))
        model.model.bias.copy_(torch.tensor([5.0, 5, 5]))
    grow_masks(model, 0.25, 0.8)
    assert model.mask.weight.tolist() == [0, 1, 0, 0]  # |delta| from the initialization: 0.9 is the largest
    assert model.mask.bias.tolist() == [0, 0, 0]  # biases are never personal (official: "weight" in the name)
    assert model.snapshot.weight.tolist() == pytest.approx([0.1, -0.9, 0.2, 0.0])
    assert model.snapshot.bias.tolist() == [5, 5, 5]


def test_a_round_grows_from_the_trained_weights_then_merges_under_the_uploaded_mask():
    model = Selective(Vector([0, 0, 0, 0]))
    with torch.no_grad():  # as the last round's training left it; the server's average is pending
        model.model.weight.copy_(torch.tensor([0.1, -0.9, 0.2, 0.0]))
    model.receive_weights({"model.weight": torch.tensor([7.0, 7, 7, 7]), "model.bias": torch.ones(3)})
    fit_select(model, torch.zeros(0, 1, 2, 2, dtype=torch.uint8), torch.zeros(0, dtype=torch.int64), epochs=1,
               rate=0.25, limit=0.8, grow=True, batch_size=4, optimizer=torch.optim.SGD, transformations=None,
               trainer=CPU, seed=0)
    assert model.mask.weight.tolist() == [0, 1, 0, 0]  # from |trained - initialization|, before the merge
    assert model.snapshot.weight.tolist() == pytest.approx([0.1, -0.9, 0.2, 0.0])
    # the official broadcast uses the mask the client uploaded with: the entry that just became personal merges too
    assert model.model.weight.tolist() == [7, 7, 7, 7]
    assert model.model.bias.tolist() == [1, 1, 1] and int(model.has_pending) == 0


def test_the_schedule_follows_the_official_rounds():
    # official: a mask update after round r with r % every == 0 and r != 0, applied from round r + 1
    assert [r for r in range(1, 11) if grows_before(r, 3)] == [4, 7, 10]
    assert not any(grows_before(r, 0) for r in range(1, 11))


# --------------------------------------------------------------------------- LocalAlt
PASSES: list[list[torch.Tensor]] = []


class Recording(SelectModule):
    """Keeps the weights after each pass."""

    def on_train_epoch_end(self) -> None:
        super().on_train_epoch_end()
        PASSES.append([p.detach().clone() for p in self.backbone.parameters()])


def tiny() -> Selective:
    torch.manual_seed(3)
    model = Selective(nn.Sequential(nn.Conv2d(1, 3, 3), nn.BatchNorm2d(3), nn.ReLU(), nn.Flatten(),
                                    nn.Linear(3 * 6 * 6, 4)))
    g = torch.Generator().manual_seed(4)
    for mask in model.masks():
        mask.copy_((torch.rand(mask.shape, generator=g) < 0.5).to(torch.uint8))
    return model


@pytest.mark.parametrize("optimizer", [
    lambda params: torch.optim.Adam(params, lr=0.01),
    lambda params: torch.optim.SGD(params, lr=0.05, momentum=0.9, weight_decay=0.01),
], ids=["adam", "sgd-momentum-wd"])
def test_local_alt_leaves_frozen_entries_bit_identical(optimizer):
    model = tiny()
    g = torch.Generator().manual_seed(5)
    x = torch.randint(0, 256, (40, 1, 8, 8), dtype=torch.uint8, generator=g)
    y = torch.randint(0, 4, (40,), generator=g)
    start = [p.detach().clone() for p in model.parameters()]
    masks = [m.bool() for m in model.masks()]
    PASSES.clear()
    run_stage(model, Recording, (x, y), epochs=2, batch_size=8, optimizer=optimizer, transformations=None,
              trainer=CPU, seed=0, masks=model.masks())
    personal_pass, shared_pass = PASSES
    for m, before, after1, after2 in zip(masks, start, personal_pass, shared_pass):
        assert torch.equal(after1[~m], before[~m])  # the personal pass leaves the shared entries as they were
        assert torch.equal(after2[m], after1[m])  # and the shared pass the personal ones
    assert any(not torch.equal(a[m], b[m]) for m, a, b in zip(masks, personal_pass, start) if m.any())
    assert any(not torch.equal(a[~m], b[~m]) for m, a, b in zip(masks, shared_pass, personal_pass) if (~m).any())


# --------------------------------------------------------------------------- settings and state
def test_settings_and_one_backbone():
    with pytest.raises(ConfigError, match="algorithm.init_args.rate=1.5"):
        FedSelect(rate=1.5)
    with pytest.raises(ConfigError, match="algorithm.init_args.limit=-0.1"):
        FedSelect(limit=-0.1)
    with pytest.raises(ConfigError, match="algorithm.init_args.every=-1"):
        FedSelect(every=-1)
    with pytest.raises(ConfigError, match="FedSelect averages parameters"):
        FedSelect().validate(["test_efficientnet", "lcnet_035"])
    FedSelect().validate(["test_efficientnet"] * 3)


def test_state_round_trips_on_the_server_and_the_client():
    uploads = {i: c.weights_to_send() for i, c in enumerate(section5_clients())}
    first = FedSelect(rate=0.5, limit=0.6, every=2)
    again = FedSelect(rate=0.5, limit=0.6, every=2)
    buffer = io.BytesIO()
    torch.save(first.state_dict(), buffer)
    buffer.seek(0)
    again.load_state_dict(torch.load(buffer, weights_only=True))
    a, b = first.server_step(3, uploads), again.server_step(3, uploads)
    assert a.download_bytes == b.download_bytes
    assert all(torch.equal(a.targets[i][k], b.targets[i][k]) for i in a.targets for k in a.targets[i])
    # the client's mask, snapshot and pending average ride in its model's state dict
    model = section5_clients()[1]
    model.receive_weights({"model.weight": torch.tensor([7.0, 7, 7, 7]), "model.bias": torch.ones(3)})
    grow_masks(model, 0.5, 1.0)
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    buffer.seek(0)
    fresh = Selective(Vector([0, 0, 0, 0]))
    fresh.load_state_dict(torch.load(buffer, weights_only=True))
    assert all(torch.equal(fresh.weights_to_send()[k], v) for k, v in model.weights_to_send().items())
    for m in (model, fresh):
        m.merge_pending([torch.tensor([0, 1, 0, 1], dtype=torch.uint8), torch.zeros(3, dtype=torch.uint8)])
    assert fresh.model.weight.tolist() == model.model.weight.tolist() == [7, 4, 7, 6]


# --------------------------------------------------------------------------- end to end
@pytest.mark.slow
def test_a_digits_fit_grows_each_weight_tensor_by_the_pinned_count_and_counts_its_bytes(repo_root, tmp_path):
    import csv
    import math

    from cosmos_pl.cli import main
    from cosmos_pl.runs.checkpoint import load_latest

    run_dir = tmp_path / "run"
    main(["fit", "--config", str(repo_root / "configs/digits_flower.yaml"), "--algorithm", "fedselect",
          "--algorithm.every", "1", "--data.num_clients", "3", "--clients.backbones", "[test_efficientnet]",
          "--rounds", "2", "--run_dir", str(run_dir)])
    checkpoint, _ = load_latest(run_dir)
    rows = list(csv.DictReader((run_dir / "metrics.csv").open()))
    for state in checkpoint["clients"]["models"]:  # one mask update, before round 2 (every = 1)
        shared = mask_bytes = 0
        for key, mask in state.items():
            if key.startswith("mask."):
                expected = grow_count(mask.numel(), 0, 0.25, 0.8) if key.endswith("weight") else 0
                assert int(mask.sum()) == expected, key
                shared += mask.numel() - int(mask.sum())
                mask_bytes += math.ceil(mask.numel() / 8)
        assert int(rows[2]["upload_bytes_per_client"]) == 4 * shared + mask_bytes
        assert int(rows[2]["download_bytes_per_client"]) == 4 * shared
    assert int(rows[1]["download_bytes_per_client"]) > int(rows[2]["download_bytes_per_client"])
