"""Flower in the peers benchmark: FedAvg through Flower's simulation engine (``flwr.simulation.run_simulation``,
the Ray backend), with a ``ClientApp`` and a ``ServerApp`` written the way Flower's PyTorch quickstart writes them
(``examples/quickstart-pytorch``: the Message API, ``flwr.serverapp.strategy.FedAvg``, a fresh model and optimizer
in every ``train`` call, the weights in an ``ArrayRecord``, accuracy from ``evaluate`` replies).

    python benchmarks/peers/flower_adapter.py --partition PART --spec JSON --out RECORD.json

Where it departs from the quickstart, so that the work equals the other systems':
- data: each virtual SuperNode ``partition-id`` i reads ``PART/client_i/data.npz`` (the quickstart downloads
  CIFAR-10 through flwr-datasets); pixels ``(x / 255 - 0.5) / 0.5`` as its ``Normalize((0.5,), (0.5,))``;
- model and optimizer: the shared backbone (:func:`spec.make_model`) and Adam at ``spec.lr`` (the quickstart's
  ``Net`` and SGD);
- a last batch of one sample is dropped (BatchNorm cannot train on it), cosmos-pl's rule;
- one Ray actor with ``spec.threads`` CPUs runs the clients one after another (``client_resources``), and each
  ``train`` call seeds torch from (seed, round, client) so that a run repeats;
- the strategy notes the time each round's evaluation ends and counts the bytes of the arrays it sends and gets.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from spec import Spec, load_partition, make_model, normalize, versions, write_record  # noqa: E402

_DATA: dict = {}  # per process: partition folder -> (clients, classes), loaded once like the quickstart's `fds`


def _client(partition: str, cid: int):
    if partition not in _DATA:
        clients, _, classes = load_partition(partition)
        _DATA[partition] = (clients, classes)
    clients, classes = _DATA[partition]
    return clients[cid], len(classes)


def _model(spec: Spec, data, num_classes: int):
    return make_model(spec, num_classes, data.x_train.shape[1], data.x_train.shape[2])


def train_fn(net, x, y, epochs: int, batch_size: int, lr: float) -> float:
    """The quickstart's ``train`` with Adam: ``epochs`` passes over ``(x [n, C, H, W] uint8, y [n])``; mean loss."""
    import torch

    criterion = torch.nn.CrossEntropyLoss()
    optimizer = torch.optim.Adam(net.parameters(), lr=lr)
    net.train()
    n = len(x)
    drop_last = n > batch_size and n % batch_size == 1
    running, steps = 0.0, 0
    for _ in range(epochs):
        order = torch.randperm(n)
        for start in range(0, n, batch_size):
            idx = order[start:start + batch_size]
            if drop_last and len(idx) == 1:
                continue
            optimizer.zero_grad()
            loss = criterion(net(normalize(x[idx])), torch.as_tensor(y[idx]))
            loss.backward()
            optimizer.step()
            running, steps = running + loss.item(), steps + 1
    return running / max(steps, 1)


def test_fn(net, x, y, batch_size: int = 256) -> tuple[float, float]:
    """``(mean loss, top-1 accuracy)`` of ``net`` in eval mode on ``(x, y)``."""
    import torch

    net.eval()
    correct, loss = 0, 0.0
    with torch.no_grad():
        for start in range(0, len(x), batch_size):
            out = net(normalize(x[start:start + batch_size]))
            target = torch.as_tensor(y[start:start + batch_size])
            loss += torch.nn.functional.cross_entropy(out, target, reduction="sum").item()
            correct += int((out.argmax(1) == target).sum())
    return loss / len(x), correct / len(x)


def build_apps(spec: Spec, partition: str, log: dict):
    """``(ClientApp, ServerApp)``; the ServerApp fills ``log`` with ``round_end_unix``, the arrays' ``bytes`` of
    each round's training exchange and ``eval_bytes`` of its evaluation requests, and the last round's ``accuracy``
    by partition id."""
    import torch
    from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
    from flwr.clientapp import ClientApp
    from flwr.serverapp import Grid, ServerApp
    from flwr.serverapp.strategy import FedAvg

    client_app = ClientApp()

    def received(msg: Message, context: Context):
        """``(partition id, its data, the model holding the weights the message carries)``."""
        torch.set_num_threads(spec.threads)
        cid = int(context.node_config["partition-id"])
        data, num_classes = _client(partition, cid)
        model = _model(spec, data, num_classes)
        model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
        return cid, data, model

    @client_app.train()
    def train(msg: Message, context: Context):
        cid, data, model = received(msg, context)
        rnd = int(msg.content["config"]["server-round"])
        torch.manual_seed(spec.seed * 1_000_003 + rnd * 1009 + cid)
        loss = train_fn(model, data.x_train, data.y_train, spec.local_epochs, spec.batch_size, spec.lr)
        content = RecordDict({"arrays": ArrayRecord(model.state_dict()),
                              "metrics": MetricRecord({"train_loss": loss, "num-examples": len(data.x_train)})})
        return Message(content=content, reply_to=msg)

    @client_app.evaluate()
    def evaluate(msg: Message, context: Context):
        cid, data, model = received(msg, context)
        loss, acc = test_fn(model, data.x_test, data.y_test)
        metrics = {"eval_loss": loss, "eval_acc": acc, "num-examples": len(data.x_test), "partition-id": cid}
        return Message(content=RecordDict({"metrics": MetricRecord(metrics)}), reply_to=msg)

    def arrays_bytes(messages) -> int:
        return sum(sum(len(a.data) for a in m.content["arrays"].values()) for m in messages
                   if m.has_content() and "arrays" in m.content)

    class TimedFedAvg(FedAvg):
        """FedAvg that notes each round's end and the bytes its messages carry (no change to what it does)."""

        def configure_train(self, server_round, arrays, config, grid):
            out = list(super().configure_train(server_round, arrays, config, grid))
            log["bytes"][server_round] = log["bytes"].get(server_round, 0) + arrays_bytes(out)
            return out

        def aggregate_train(self, server_round, replies):
            replies = list(replies)
            log["bytes"][server_round] = log["bytes"].get(server_round, 0) + arrays_bytes(replies)
            return super().aggregate_train(server_round, replies)

        def configure_evaluate(self, server_round, arrays, config, grid):
            out = list(super().configure_evaluate(server_round, arrays, config, grid))
            log["eval_bytes"][server_round] = arrays_bytes(out)  # the quickstart sends the model again to score it
            return out

        def aggregate_evaluate(self, server_round, replies):
            replies = list(replies)
            log["accuracy"] = {int(m.content["metrics"]["partition-id"]): float(m.content["metrics"]["eval_acc"])
                               for m in replies if m.has_content()}
            out = super().aggregate_evaluate(server_round, replies)
            log["round_end_unix"].append(time.time())
            return out

    server_app = ServerApp()

    @server_app.main()
    def main(grid: Grid, context: Context) -> None:
        data, num_classes = _client(partition, 0)
        torch.manual_seed(spec.seed)
        model = _model(spec, data, num_classes)
        strategy = TimedFedAvg(fraction_train=1.0, fraction_evaluate=1.0)
        strategy.start(grid=grid, initial_arrays=ArrayRecord(model.state_dict()), num_rounds=spec.rounds,
                       train_config=ConfigRecord({"lr": spec.lr}))

    return client_app, server_app


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--partition", required=True)
    ap.add_argument("--spec", required=True, help="Spec(...).to_json() text")
    ap.add_argument("--out", required=True, type=Path)
    a = ap.parse_args(argv)
    spec = Spec.from_json(a.spec)
    partition = str(Path(a.partition).resolve())
    clients, _, _ = load_partition(partition)
    from flwr.simulation import run_simulation

    log: dict = {"round_end_unix": [], "bytes": {}, "eval_bytes": {}, "accuracy": {}}
    client_app, server_app = build_apps(spec, partition, log)
    run_simulation(server_app=server_app, client_app=client_app, num_supernodes=len(clients),
                   backend_config={"client_resources": {"num_cpus": spec.threads, "num_gpus": 0.0},
                                   "init_args": {"num_cpus": spec.threads, "include_dashboard": False}})
    if len(log["round_end_unix"]) != spec.rounds or len(log["accuracy"]) != len(clients):
        print(f"flower: {len(log['round_end_unix'])} of {spec.rounds} rounds ended, {len(log['accuracy'])} of "
              f"{len(clients)} clients evaluated in the last; see the log above", file=sys.stderr)
        return 1
    write_record(a.out, system="Flower", algorithm="fedavg", round_end_unix=log["round_end_unix"],
                 client_accuracy=[log["accuracy"][i] for i in range(len(clients))],
                 bytes_per_round=log["bytes"][spec.rounds] + log["eval_bytes"][spec.rounds],
                 payload_bytes_per_round=log["bytes"][spec.rounds],
                 extra={"versions": versions("flwr", "ray", "torch")})
    return 0


if __name__ == "__main__":
    sys.exit(main())
