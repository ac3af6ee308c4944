"""The server never trusts a client: hostile replies, replayed through the real codec, the real
ClientApp and the real FlowerEngine (in-process, a Grid of our own), are refused with a logged
reason; the run completes, honest clients are never refused, and the honest clients end exactly
where they end when the hostile node says nothing at all."""

from __future__ import annotations

import dataclasses
import io
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.supercore.task_identity import TaskIdentity

from fedflock.engines.embedded import EmbeddedEngine
from fedflock.engines.flower.codec import decode_array
from fedflock.engines.flower.engine import FlowerEngine
from fedflock.experiment import Run
from fedflock.validation import validate
from fedflock.wire import InvalidReply, Reply
from tests.conftest import make_algorithm, small_config, update_reply
from tests.inprocess_grid import InProcessGrid, Tamper

HOSTILE = 2  # the partition of the hostile node


def _run(tmp_path: Path, name: str, tamper: dict[int, Tamper] | None = None,
         partitions: dict[int, int] | None = None, **overrides: object) -> dict:
    # One task per message (`eval_mode: separate`), so a tamper sees each kind on its own.
    raw = small_config(rounds=3, **{"algorithm.name": "fedavg", "eval_mode": "separate",
                                    **overrides})
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw))
    cfg = validate(raw)
    nodes = partitions or {100 + c: c for c in range(cfg.data.clients)}
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, 0
    engine = FlowerEngine(InProcessGrid(path, nodes, tamper), cfg, timeout=1.0,
                          connect_timeout=1.0)
    return Run(cfg, tmp_path / name, quiet=True).execute(engine=engine)


# -- crafted replies -----------------------------------------------------------------------

def _is_task(message: Message, kind: str = "train.train") -> bool:
    return message.metadata.message_type == kind


def _rebuild(message: Message, original: Message, **parts: object) -> list[Message]:
    """The reply with some of its records replaced (`tensors`, `metrics`, `reply` of its one
    task)."""
    content = original.content
    records = {"tensors": content.array_records.get("0.tensors", ArrayRecord()),
               "metrics": content.metric_records.get("0.metrics", MetricRecord()),
               "reply": content.config_records.get("0.reply", ConfigRecord())}
    records.update(parts)
    records = {f"0.{k}": v for k, v in records.items()}
    return [Message(RecordDict({k: v for k, v in records.items() if v is not None}),
                    reply_to=message)]


def _update(reply: Message) -> np.ndarray:
    return reply.content.array_records["0.tensors"]["update"].numpy()


def _with_update(values: np.ndarray) -> Tamper:
    def tamper(message: Message, reply: Message) -> list[Message]:
        if not _is_task(message):
            return [reply]
        return _rebuild(message, reply, tensors=ArrayRecord({"update": Array(values(
            _update(reply)))}))
    return tamper  # type: ignore[return-value]


def _huge_header(message: Message, reply: Message) -> list[Message]:
    """150 bytes claiming an 8e9-float (30 GiB) update."""
    if not _is_task(message):
        return [reply]
    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(buffer, {"descr": "<f4", "fortran_order": False,
                                                  "shape": (8_000_000_000,)})
    data = buffer.getvalue() + b"\0" * 16
    array = Array(dtype="float32", shape=(8_000_000_000,), stype="numpy.ndarray", data=data)
    return _rebuild(message, reply, tensors=ArrayRecord({"update": array}))


def _with_meta(**values: object) -> Tamper:
    def tamper(message: Message, reply: Message) -> list[Message]:
        if not _is_task(message):
            return [reply]
        meta = dict(reply.content.config_records["0.reply"])
        meta.update(values)
        return _rebuild(message, reply, reply=ConfigRecord(meta))
    return tamper  # type: ignore[return-value]


def _with_metrics(metrics: dict | None, kind: str = "train.train") -> Tamper:
    def tamper(message: Message, reply: Message) -> list[Message]:
        if not _is_task(message, kind):
            return [reply]
        return _rebuild(message, reply, metrics=None if metrics is None
                        else MetricRecord(metrics))
    return tamper  # type: ignore[return-value]


def _evaluation_about(other: int) -> Tamper:
    def tamper(message: Message, reply: Message) -> list[Message]:
        if not _is_task(message, "train.evaluate"):
            return [reply]
        meta = dict(reply.content.config_records["0.reply"])
        return _rebuild(message, reply, reply=ConfigRecord({**meta, "client": other}))
    return tamper  # type: ignore[return-value]


def _silent(message: Message, reply: Message) -> list[Message]:
    return [] if message.metadata.message_type.startswith("train.") else [reply]


HOSTILE_REPLIES: dict[str, tuple[Tamper, str]] = {
    "float16 update": (_with_update(lambda u: u.astype(np.float16)), "torch.float16, the agreed"),
    "integer update": (_with_update(lambda u: u.astype(np.int32)), "torch.int32, the agreed"),
    "30 GiB header in 150 bytes": (_huge_header, "bytes arrived"),
    "short update": (_with_update(lambda u: u[:-1]), "shape"),
    "NaN update": (_with_update(lambda u: np.full_like(u, np.nan)), "NaN"),
    "1e38 update": (_with_update(lambda u: np.full_like(u, 1e38)), "median"),
    "1e12 examples": (_with_meta(**{"num-examples": 10**12}), "declared"),
    "negative examples": (_with_meta(**{"num-examples": -5}), "not a count"),
    "fractional examples": (_with_meta(**{"num-examples": 2.5}), "whole number"),
    "claims another client": (_with_meta(client=0), "claims client 0"),
    "no loss": (_with_metrics({}), "'loss'"),
    "infinite loss": (_with_metrics({"loss": float("inf")}), "'loss'"),
    "list as loss": (_with_metrics({"loss": [1.0, 2.0]}), "'loss'"),
    "no metrics record": (_with_metrics(None), "record '0.metrics'"),
    "evaluation of another client": (_evaluation_about(0), "claims client 0"),
    "evaluation without metrics": (_with_metrics({}, "train.evaluate"), "without metrics"),
}


EVALUATION_CASES = {"evaluation of another client", "evaluation without metrics"}


@pytest.fixture(scope="module")
def honest(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return _run(tmp_path_factory.mktemp("honest"), "honest")


@pytest.fixture(scope="module")
def without_hostile(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The same federation where the hostile node answers nothing at all."""
    return _run(tmp_path_factory.mktemp("silent"), "silent", {100 + HOSTILE: _silent})


@pytest.mark.parametrize("case", sorted(HOSTILE_REPLIES))
def test_hostile_reply_is_refused_and_the_run_goes_on(tmp_path: Path, case: str,
                                                      without_hostile: dict, honest: dict
                                                      ) -> None:
    """The reference: the run where the hostile node is silent (its evaluation only is
    hostile: the honest run, as its training was)."""
    tamper, reason = HOSTILE_REPLIES[case]
    reference_run = honest if case in EVALUATION_CASES else without_hostile
    summary = _run(tmp_path, "run", {100 + HOSTILE: tamper})
    refused = summary.get("rejected_replies", [])
    assert refused and {r["client"] for r in refused} == {HOSTILE}, refused
    assert all(reason in r["reason"] for r in refused), refused
    clean = [c for c in range(summary["num_clients"]) if c != HOSTILE]
    ours, reference = summary["accuracy"]["per_client"], reference_run["accuracy"]["per_client"]
    assert [ours[c] for c in clean] == [reference[c] for c in clean]
    assert all(np.isfinite(ours[c]) for c in clean)


def test_honest_federation_refuses_nothing(honest: dict) -> None:
    assert "rejected_replies" not in honest and honest["accuracy"]["mean"] > 0


# -- the handshake -----------------------------------------------------------------------------

def _handshake_reply(**info: object) -> Tamper:
    def tamper(message: Message, reply: Message) -> list[Message]:
        if message.metadata.message_type != "query":
            return [reply]
        content = reply.content
        merged = {**dict(content.config_records["info"]), **info}
        return [Message(RecordDict({"info": ConfigRecord(merged),
                                    "models": content.array_records["models"]}),
                        reply_to=message)]
    return tamper  # type: ignore[return-value]


def test_a_stray_node_claiming_a_taken_partition_is_refused(tmp_path: Path,
                                                            without_hostile: dict) -> None:
    """Partition 2's seat is taken by node 99 (it sorts first); the real node 102 is refused
    at the handshake, node 99 never answers a task: the run equals the silent one."""
    nodes = {99: HOSTILE, **{100 + c: c for c in range(6)}}
    summary = _run(tmp_path, "stray", {99: _silent}, partitions=nodes)
    refused = summary["rejected_replies"]
    assert [(r["round"], r["node"]) for r in refused] == [(0, 100 + HOSTILE)]
    assert "already joined" in refused[0]["reason"]
    clean = [c for c in range(6) if c != HOSTILE]
    assert [summary["accuracy"]["per_client"][c] for c in clean] == \
        [without_hostile["accuracy"]["per_client"][c] for c in clean]


@pytest.mark.parametrize("info, reason", [
    ({"client": 17}, "outside"),
    ({"num-examples": 0}, "positive"),
    ({"update-size": 3}, "update-size differs"),
    ({"masked": True}, "masked differs"),
    ({"client": "two"}, "whole number"),
])
def test_a_bad_handshake_is_refused_and_the_others_run(tmp_path: Path, info: dict,
                                                       reason: str) -> None:
    summary = _run(tmp_path, "bad", {100 + HOSTILE: _handshake_reply(**info)})
    refused = summary["rejected_replies"]
    assert len(refused) == 1 and refused[0]["node"] == 100 + HOSTILE
    assert reason in refused[0]["reason"]
    assert HOSTILE in [int(c) for c in summary["missing_rounds"]]
    assert summary["accuracy"]["per_client"][HOSTILE] is None


def test_only_the_asked_node_sets_the_initial_model(tmp_path: Path, honest: dict) -> None:
    """Node 103 attaches a model of its own to its handshake: it is not read."""
    def extra_model(message: Message, reply: Message) -> list[Message]:
        if message.metadata.message_type != "query":
            return [reply]
        info = reply.content.config_records["info"]
        poison = Array(np.full(int(info["update-size"]) + 10, 1e30, dtype=np.float32)[None])
        return [Message(RecordDict({"info": info, "models": ArrayRecord({"models": poison})}),
                        reply_to=message)]

    summary = _run(tmp_path, "extra", {103: extra_model})
    assert summary["accuracy"] == honest["accuracy"]


def test_decoding_never_allocates_beyond_what_arrived() -> None:
    buffer = io.BytesIO()
    np.lib.format.write_array_header_2_0(buffer, {"descr": "<f8", "fortran_order": False,
                                                  "shape": (2**40,)})
    array = Array(dtype="float64", shape=(2**40,), stype="numpy.ndarray",
                  data=buffer.getvalue() + b"\0" * 8)
    with pytest.raises(InvalidReply, match="bytes arrived"):
        decode_array("update", array)
    good = Array(np.arange(6, dtype=np.float32).reshape(2, 3))
    assert torch.equal(decode_array("x", good), torch.arange(6, dtype=torch.float32).reshape(2, 3))
    with pytest.raises(InvalidReply, match="not a number type"):
        decode_array("x", Array(np.array(["a", "b"])))
    lying = Array(dtype="float32", shape=(6,), stype="numpy.ndarray", data=good.data)
    with pytest.raises(InvalidReply, match="disagree"):
        decode_array("x", lying)


def test_the_flower_server_resumes_only_when_asked(tmp_path: Path) -> None:
    """The ServerApp refuses a directory that holds a run (no silent resume), and continues it
    with `resume=true`, as `fedflock run` and `--resume` do."""
    from fedflock.engines.flower.serverapp import main
    from fedflock.errors import FedflockError

    raw = small_config(rounds=3)
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(raw))
    out = tmp_path / "run"
    grid = InProcessGrid(path, {100 + c: c for c in range(6)})

    def serve(**extra: object) -> None:
        TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, 0
        main(grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(),
                           run_config={"config": str(path), "out": str(out), **extra}))

    serve()
    first = (out / "summary.json").read_text()
    with pytest.raises(FedflockError, match="already holds a run"):
        serve()
    assert "already holds a run" in (out / "error.txt").read_text()
    assert (out / "summary.json").read_text() == first
    serve(resume=True)
    assert not (out / "error.txt").exists()
    assert (out / "summary.json").is_file()


# -- the same checks in the embedded engine ---------------------------------------------------

class Tampered(EmbeddedEngine):
    """Client HOSTILE's train replies rewritten by `change` (the embedded engine's clients)."""

    change: Callable[[Reply], Reply] = staticmethod(lambda r: r)

    def run_tasks(self, rnd, tasks):
        return [self.change(r) if r.client == HOSTILE and "update" in r.tensors else r
                for r in super().run_tasks(rnd, tasks)]


@pytest.mark.parametrize("change, reason", [
    (lambda r: r.with_tensors(update=torch.full_like(r.update, 1e38)), "median"),
    (lambda r: dataclasses.replace(r, num_examples=10**12), "declared"),
    (lambda r: r.with_tensors(update=r.update.double()), "agreed"),
    (lambda r: dataclasses.replace(r, metrics={"loss": float("nan")}), "'loss'"),
])
def test_the_embedded_engine_refuses_the_same(tmp_path: Path, change: Callable, reason: str
                                              ) -> None:
    cfg = validate(small_config(rounds=3))
    engine = Tampered.from_config(cfg)
    engine.change = change
    summary = Run(cfg, tmp_path / "run", quiet=True).execute(engine=engine)
    refused = summary["rejected_replies"]
    assert {r["client"] for r in refused} == {HOSTILE} and len(refused) == 3
    assert all(reason in r["reason"] for r in refused)


def test_an_aggregate_that_overflows_never_replaces_a_model() -> None:
    algorithm = make_algorithm("fedavg", 2, 4)
    huge = torch.full((4,), 3e38)
    algorithm.aggregate_train(1, [update_reply(0, huge), update_reply(1, huge)])
    assert torch.equal(algorithm.model_of(0), huge) and not algorithm.kept
    algorithm.aggregate_train(2, [update_reply(0, huge), update_reply(1, huge)])
    assert torch.equal(algorithm.model_of(0), huge)  # 6e38 overflows float32: kept
    assert algorithm.kept == ["cluster 0"]
