"""The built-in client tasks: train, gradient, select, losses, basis, evaluate, responses.

Each is one registered `Task` (see `fedflock.wire`): its fields are what the server sends,
`run` is what the client computes on its own data, `check` what the server accepts back.
Algorithms import this module to build tasks; `run` reaches the training loop through the
runtime it is given (`runtime.routines`: `fedflock.client.training`), so this module imports no
client execution and server logic never loads it (DESIGN; an import-linter contract checks it).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from fedflock.data.poisoning import flip_labels
from fedflock.registry import Registry
from fedflock.wire import (
    ClientSide,
    InvalidReply,
    Reply,
    Task,
    check_metrics,
    check_tensor,
    register_task,
)


def _check_update(task: Task, reply: Reply, size: int) -> None:
    """The update, finite, of the agreed size, and the training loss, unless the client says it
    kept it under differential privacy (`noise_std`: the noise it added)."""
    check_tensor(reply, "update", (size,))
    if "noise_std" not in reply.metrics:
        check_metrics(reply, ["loss"])
    Task.check(task, reply)


def released(runtime: ClientSide, task: Task, start: torch.Tensor, update: torch.Tensor,
             loss: float, num_examples: int, salt: str) -> Reply:
    """The reply carrying a trained update. Under `privacy.dp` the update is clipped and noised
    here, on the client, before masking (`ClientDP.release`), and the training loss, a statistic
    of private data that no mechanism noised, is replaced by the (public) noise std."""
    dp = runtime.dp
    if dp is None:
        return Reply(task.client, {"update": runtime.send(update)}, {"loss": loss}, num_examples)
    noised = dp.release(update, runtime.task_seed(task, f"dp-{salt}"), start)
    return Reply(task.client, {"update": runtime.send(noised)}, {"noise_std": dp.noise_std},
                 num_examples)


def local_training(runtime: ClientSide, task: Task, start: torch.Tensor, salt: str,
                   epochs: int | None = None, sample_weights: torch.Tensor | None = None,
                   proximal: Any = None, trainable: torch.Tensor | None = None
                   ) -> tuple[torch.Tensor, float]:
    """(update, mean loss) of the client's local training from `start`: DP-SGD under a
    per-sample mechanism, plain SGD otherwise; `salt` names the training in the task's seeds
    (a task training several models gives each its own, so no two share noise)."""
    training = runtime.routines
    data = runtime.client_data(task.client)
    weights = None if sample_weights is None else sample_weights.to(runtime.dtype)
    seed = runtime.task_seed(task, salt)
    if runtime.dp is not None and runtime.dp.per_sample:
        return training.train_model_private(
            runtime.dp, runtime.model, runtime.spec, start, data.x_train, data.y_train,
            runtime.training, seed, runtime.task_seed(task, f"dp-sgd-{salt}"), epochs,
            runtime.objective, weights, proximal, trainable=trainable)
    return training.train_model(runtime.model, runtime.spec, start, data.x_train, data.y_train,
                                runtime.training, seed, epochs, runtime.objective, weights,
                                proximal, trainable)


@register_task
@dataclass
class Train(Task):
    """Local training from `params`; replies with the weight-update and the mean training loss.

    Options: `epochs` overrides the configured local epochs (fine-tuning); `proximal_mu` adds
    mu/2 * sum_k w_k ||theta - c_k||^2 with `centres` (K, P) and `centre_weights` (K,), or with
    the received model as the one centre when no centres are given (FedProx);
    `sample_weights` (one per training sample) weight the per-sample losses (FedRC);
    `trainable` (uint8 over the model vector, 1 = trained) holds the other parameters fixed
    (FedBABU's head). A method sending it knows the model's layout, so it refuses masking.
    """

    kind = "train"
    params: torch.Tensor
    epochs: int | None = None
    proximal_mu: float | None = None
    centres: torch.Tensor | None = None
    centre_weights: torch.Tensor | None = None
    sample_weights: torch.Tensor | None = None
    trainable: torch.Tensor | None = None

    @property
    def plain(self) -> bool:
        """Plain local SGD (what the batched executor runs in one vectorised pass)."""
        return not self.proximal_mu and self.sample_weights is None and self.trainable is None

    @property
    def salt(self) -> str:
        return "train" if self.epochs is None else "finetune"

    def proximal(self, runtime: ClientSide, start: torch.Tensor) -> Any:
        """The proximal term (`training.Proximal`), or None without one."""
        training = runtime.routines
        if not self.proximal_mu:
            return None
        if self.centres is None:
            return training.Proximal(self.proximal_mu, start[None],
                                     torch.ones(1, dtype=start.dtype))
        centres = runtime.receive(self.centres)
        weights = (torch.ones(len(centres)) if self.centre_weights is None
                   else self.centre_weights).to(start.dtype)
        return training.Proximal(self.proximal_mu, centres, weights)

    def run(self, runtime: ClientSide) -> Reply:
        data = runtime.client_data(self.client)
        start = runtime.receive(self.params)
        update, loss = local_training(runtime, self, start, self.salt, self.epochs,
                                      self.sample_weights, self.proximal(runtime, start),
                                      self.trainable)
        return released(runtime, self, start, update, loss, data.num_train, self.salt)

    def updates(self, reply: Reply) -> list[tuple[Hashable, torch.Tensor]]:
        return [(id(self.params), reply.update)]

    def check(self, reply: Reply) -> None:
        _check_update(self, reply, int(self.params.shape[-1]))


@register_task
@dataclass
class Gradient(Task):
    """One full-batch gradient at `params`, sent as the update -lr * grad (CFL's gradient
    variant; buffers unchanged). Under DP-SGD: one noised gradient of one Poisson batch (a
    full batch would be a step at sample rate 1, which the accounting of training does not
    cover)."""

    kind = "gradient"
    params: torch.Tensor

    def run(self, runtime: ClientSide) -> Reply:
        training = runtime.routines
        data = runtime.client_data(self.client)
        start = runtime.receive(self.params)
        salt = "gradient"
        if runtime.dp is not None and runtime.dp.per_sample:
            update, loss = training.train_model_private(
                runtime.dp, runtime.model, runtime.spec, start, data.x_train, data.y_train,
                runtime.training, runtime.task_seed(self, salt),
                runtime.task_seed(self, f"dp-sgd-{salt}"), objective=runtime.objective,
                single_step=True)
        else:
            update, loss = training.gradient_step(runtime.model, runtime.spec, start, data.x_train,
                                         data.y_train, runtime.training, runtime.objective)
        return released(runtime, self, start, update, loss, data.num_train, salt)

    def updates(self, reply: Reply) -> list[tuple[Hashable, torch.Tensor]]:
        return [(id(self.params), reply.update)]

    def check(self, reply: Reply) -> None:
        _check_update(self, reply, int(self.params.shape[-1]))


# A selection criterion picks one of K models from their (accuracy, mean loss) rows, computed on
# the client's own training data.
Criterion = Callable[[torch.Tensor], int]
CRITERIA: Registry[Criterion] = Registry("selection criterion")


@CRITERIA.register("loss", "lowest mean training loss (IFCA)")
def _lowest_loss(scores: torch.Tensor) -> int:
    return int(torch.argmin(scores[:, 1]))


@CRITERIA.register("accuracy", "highest training accuracy, then lowest loss")
def _most_accurate(scores: torch.Tensor) -> int:
    return int(max(range(len(scores)), key=lambda k: (scores[k, 0], -scores[k, 1])))


def model_scores(runtime: ClientSide, client: int, models: torch.Tensor) -> torch.Tensor:
    """(accuracy, mean loss) of each of K models (rows) on the client's training data."""
    training = runtime.routines
    data = runtime.client_data(client)
    out = []
    for params in models:
        predicted, losses = training.sample_losses(
            runtime.load_eval(params), training.eval_layout(data.x_train), data.y_train,
            runtime.objective)
        accuracy = (predicted == data.y_train).double().mean()
        out.append(torch.stack([accuracy, losses.double().mean()]))
    return torch.stack(out)


@register_task
@dataclass
class Select(Task):
    """K models (rows of `models`); the client scores each on its own training data, picks one
    by `criterion` (lowest loss by default, as IFCA) and, when `train`, trains it. Replies with
    `scores` (K, 2: accuracy, loss), the metric `choice` and the update of the chosen model."""

    kind = "select"
    models: torch.Tensor
    criterion: str = "loss"
    train: bool = True
    epochs: int | None = None

    def run(self, runtime: ClientSide) -> Reply:
        scores = model_scores(runtime, self.client, self.models)
        choice = CRITERIA.get(self.criterion)(scores)
        metrics = {"choice": float(choice), "loss": float(scores[choice, 1])}
        tensors = {"scores": scores.to(runtime.dtype)}
        if self.train:
            reply = Train(self.client, self.round, self.models[choice], self.epochs).run(runtime)
            tensors["update"] = reply.update
            if "loss" in reply.metrics:  # kept on the client under DP (the score's is sent)
                metrics["loss"] = reply.loss
        return Reply(self.client, tensors, metrics, runtime.num_examples(self.client))

    def updates(self, reply: Reply) -> list[tuple[Hashable, torch.Tensor]]:
        return [((id(self.models), reply.choice), reply.update)] if self.train else []

    def check(self, reply: Reply) -> None:
        k, size = self.models.shape
        check_tensor(reply, "scores", (k, 2))
        check_metrics(reply, ["choice", "loss"])
        if not float(reply.metrics["choice"]).is_integer() or not 0 <= reply.metrics[
                "choice"] < k:
            raise InvalidReply(f"choice {reply.metrics['choice']!r} is not one of 0..{k - 1}")
        if self.train:
            check_tensor(reply, "update", (size,))
        Task.check(self, reply)


@register_task
@dataclass
class Losses(Task):
    """Per-sample training losses under each of K models: `losses` (K, n)."""

    kind = "losses"
    models: torch.Tensor

    def run(self, runtime: ClientSide) -> Reply:
        training = runtime.routines
        data = runtime.client_data(self.client)
        rows = [training.sample_losses(runtime.load_eval(p), training.eval_layout(data.x_train),
                                       data.y_train, runtime.objective)[1] for p in self.models]
        return Reply(self.client, {"losses": torch.stack(rows).to(runtime.dtype)}, {},
                     data.num_train)

    def check(self, reply: Reply) -> None:
        check_tensor(reply, "losses", (len(self.models), reply.num_examples))
        Task.check(self, reply)


@register_task
@dataclass
class Basis(Task):
    """Per class, the top `rank` left singular vectors of the client's raw training inputs (the
    d x n_c matrix of its class-c samples): `basis` (C, d, rank), zero where the client has fewer
    samples, and `counts` (C,). A data signature that reveals no sample (PACFL, FedDAG).
    `per_class: false` gives one basis of all samples (1, d, rank). The server gives the
    shape it expects (`classes`, `dim`: the data description's), and a reply of another
    shape is refused."""

    kind = "basis"
    rank: int = 3
    per_class: bool = True
    classes: int | None = None
    dim: int | None = None

    def run(self, runtime: ClientSide) -> Reply:
        data = runtime.client_data(self.client)
        x = data.x_train.reshape(len(data.y_train), -1).double()
        classes = runtime.data_spec.num_classes if self.per_class else 1
        basis = torch.zeros(classes, x.shape[1], self.rank, dtype=torch.float64)
        counts = torch.zeros(classes, dtype=torch.float64)
        for c in range(classes):
            rows = x[data.y_train == c] if self.per_class else x
            counts[c] = len(rows)
            if len(rows):
                u, _, _ = torch.linalg.svd(rows.T, full_matrices=False)
                basis[c, :, : min(self.rank, u.shape[1])] = u[:, : self.rank]
        return Reply(self.client, {"basis": basis.to(runtime.dtype),
                                   "counts": counts.to(runtime.dtype)}, {}, data.num_train)

    def check(self, reply: Reply) -> None:
        basis = check_tensor(reply, "basis")
        expected = (self.classes if self.per_class else 1, self.dim, self.rank)
        if basis.dim() != 3 or any(want is not None and got != want
                                   for got, want in zip(basis.shape, expected, strict=True)):
            shown = ", ".join("?" if want is None else str(want) for want in expected)
            raise InvalidReply(f"'basis' of shape {tuple(basis.shape)}, expected ({shown})")
        check_tensor(reply, "counts", (basis.shape[0],))
        Task.check(self, reply)


def held_out(runtime: ClientSide, client: int, split: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The (inputs, targets) an evaluation scores: the client's test split or its training
    data."""
    data = runtime.client_data(client)
    if split not in ("train", "test"):
        raise ValueError(f"evaluate: split {split!r} is neither 'train' nor 'test'")
    return (data.x_train, data.y_train) if split == "train" else (data.x_test, data.y_test)


@register_task
@dataclass
class Evaluate(Task):
    """The objective's metrics of `params` on the client's held-out data (`split: test`) or
    its training data (`split: train`)."""

    kind = "evaluate"
    shares_work = True
    counts_training_examples = False  # held-out samples
    params: torch.Tensor
    split: str = "test"

    def run(self, runtime: ClientSide) -> Reply:
        return self.run_many(runtime, [self])[0]

    @classmethod
    def run_many(cls, runtime: ClientSide, tasks: Sequence[Task]) -> list[Reply]:
        """Clients sharing one model tensor (a cluster) are evaluated in one forward pass."""
        training = runtime.routines
        by_model: dict[tuple[int, str], list[int]] = {}
        for i, t in enumerate(tasks):
            assert isinstance(t, Evaluate)
            by_model.setdefault((id(t.params), t.split), []).append(i)
        replies: list[Reply | None] = [None] * len(tasks)
        for positions in by_model.values():
            group = [tasks[i] for i in positions]
            xys = [held_out(runtime, t.client, t.split) for t in group]  # type: ignore[attr-defined]
            model = runtime.load_eval(group[0].params)  # type: ignore[attr-defined]
            stats = training.sample_stats(
                model, training.eval_layout(torch.cat([x for x, _ in xys])),
                torch.cat([y for _, y in xys]), runtime.objective)
            offset = 0
            for i, (_, y) in zip(positions, xys, strict=True):
                n = len(y)
                own = {k: v[offset : offset + n] for k, v in stats.items()}
                replies[i] = Reply(tasks[i].client, {}, runtime.objective.summarise(own), n)
                offset += n
        return replies  # type: ignore[return-value]

    def check(self, reply: Reply) -> None:
        """A score may be infinite (a diverged model's loss) or NaN (no held-out samples):
        that is a measurement, not a malformed reply."""
        if reply.client != self.client:
            raise InvalidReply(f"evaluation reply about client {reply.client}")
        if not reply.metrics:
            raise InvalidReply("evaluation reply without metrics")
        for name, value in reply.metrics.items():
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise InvalidReply(f"metric {name!r} is not a number ({value!r})")


@register_task
@dataclass
class MixtureTrain(Task):
    """One local round of a mixture of K models (rows of `models`; FedEM, FedRC).

    E-step on the client's training data: q_ik proportional to pi_k * p_k(y_i | x_i), divided by
    the model's label marginal P_k(y_i) when `label_marginals` (K, C) are given (FedRC), with
    p_k from the objective's per-sample loss (p = exp(-loss)) and pi the client's `weights` from
    its last round (uniform when None); M-step: pi_k = mean_i q_ik, then each model is trained
    with its q-weighted loss. Replies `updates` (K, P), `weights` (the new pi, K), the
    mixture's training loss and, with `label_marginals`, `class_mass` (K, C: sum of q_ik over
    the samples of each class). Each model's training has its own seeds (under DP, its own
    noise). The server keeps pi and sends it back (it needs it to report and evaluate the
    client anyway), so a run resumed from its checkpoint continues exactly."""

    kind = "mixture_train"
    models: torch.Tensor
    weights: torch.Tensor | None = None
    label_marginals: torch.Tensor | None = None
    epochs: int | None = None

    def responsibilities(self, runtime: ClientSide, losses: torch.Tensor,
                         labels: torch.Tensor) -> torch.Tensor:
        """q (n, K) from the per-sample losses (K, n), the samples' labels (n,) and the
        client's mixture weights."""
        k = len(self.models)
        prior = (torch.full((k,), 1.0 / k, dtype=torch.float64) if self.weights is None
                 else self.weights.double())
        log_q = prior.double().clamp_min(1e-12).log()[:, None] - losses.double()
        if self.label_marginals is not None:
            marginal = self.label_marginals.double().clamp_min(1e-12)
            log_q = log_q - marginal[:, labels].log()
        return torch.softmax(log_q, dim=0).T

    def run(self, runtime: ClientSide) -> Reply:
        training = runtime.routines
        data = runtime.client_data(self.client)
        starts = [runtime.receive(m) for m in self.models]
        layout = training.eval_layout(data.x_train)
        losses = torch.stack([training.sample_losses(runtime.load_received(m), layout,
                                                     data.y_train, runtime.objective)[1]
                              for m in starts])
        q = self.responsibilities(runtime, losses, data.y_train)
        weights = q.mean(0) if len(q) else torch.full((len(self.models),), 1 / len(self.models),
                                                       dtype=torch.float64)
        mixture_loss = -torch.logsumexp(weights.clamp_min(1e-12).log()[:, None]
                                        - losses.double(), dim=0).mean()
        updates = []
        for k, start in enumerate(starts):
            salt = f"mixture-{k}"
            update, _ = local_training(runtime, self, start, salt, self.epochs,
                                       q[:, k].to(runtime.dtype))
            updates.append(released(runtime, self, start, update, 0.0, data.num_train,
                                    salt).update)
        tensors = {"updates": torch.stack(updates), "weights": weights.to(runtime.dtype)}
        if self.label_marginals is not None:
            onehot = torch.nn.functional.one_hot(data.y_train, self.label_marginals.shape[1])
            tensors["class_mass"] = (q.T @ onehot.double()).to(runtime.dtype)
        metrics = ({"noise_std": runtime.dp.noise_std} if runtime.dp is not None
                   else {"loss": float(mixture_loss)})
        return Reply(self.client, tensors, metrics, data.num_train)

    def updates(self, reply: Reply) -> list[tuple[Hashable, torch.Tensor]]:
        return [((id(self.models), k), row) for k, row in enumerate(reply.tensors["updates"])]

    def check(self, reply: Reply) -> None:
        k, size = self.models.shape
        check_tensor(reply, "updates", (k, size))
        weights = check_tensor(reply, "weights", (k,))
        if bool((weights < 0).any()) or abs(float(weights.sum()) - 1) > 1e-3:
            raise InvalidReply("'weights' are not a probability vector")
        if self.label_marginals is not None:
            mass = check_tensor(reply, "class_mass", tuple(self.label_marginals.shape))
            if bool((mass < 0).any()):
                raise InvalidReply("'class_mass' is negative")
        if "noise_std" not in reply.metrics:
            check_metrics(reply, ["loss"])
        Task.check(self, reply)


@register_task
@dataclass
class SoftTrain(Task):
    """FedSoft's local round on the client's personal model.

    With `estimate`, or without `importance` (a client's first round), it first scores the S
    centres (rows of `centres`) on its training data: u_s = the share of its samples whose loss
    is lowest under centre s, `sigma` where that share is zero; otherwise u is the `importance`
    sent. It then trains its `personal` model (without one: a copy of the centre of its
    largest u) on its loss plus mu/2 * sum_s u_s ||w - c_s||^2. Replies with `importance` (u,
    S), the metric `choice` (the centre of its largest u) and `update`: the trained personal
    model minus that centre. The server keeps the personal model and u and sends them back
    next time (it knows both from the reply anyway), so a run resumed from its checkpoint
    continues exactly."""

    kind = "soft_train"
    centres: torch.Tensor
    personal: torch.Tensor | None = None
    importance: torch.Tensor | None = None
    mu: float = 0.1
    sigma: float = 1e-4
    estimate: bool = False

    def estimated(self, runtime: ClientSide, centres: torch.Tensor) -> torch.Tensor:
        """u from the (received) centres' per-sample losses on the client's training data."""
        training = runtime.routines
        data = runtime.client_data(self.client)
        layout = training.eval_layout(data.x_train)
        losses = torch.stack([training.sample_losses(runtime.load_received(c), layout,
                                                     data.y_train, runtime.objective)[1]
                              for c in centres])
        share = (torch.bincount(losses.argmin(0), minlength=len(self.centres)).double()
                 / max(1, losses.shape[1]))
        return torch.where(share > 0, share, torch.full_like(share, self.sigma))

    def run(self, runtime: ClientSide) -> Reply:
        training = runtime.routines
        centres = torch.stack([runtime.receive(c) for c in self.centres])
        u = (self.estimated(runtime, centres) if self.estimate or self.importance is None
             else self.importance.double())
        choice = int(u.argmax())
        start = (centres[choice] if self.personal is None
                 else runtime.receive(self.personal))
        proximal = training.Proximal(self.mu, centres, u.to(runtime.dtype))
        update, loss = local_training(runtime, self, start, "soft", proximal=proximal)
        data = runtime.client_data(self.client)
        reply = released(runtime, self, centres[choice], start + update - centres[choice],
                         loss, data.num_train, "soft")
        reply.tensors["importance"] = u.to(runtime.dtype)
        reply.metrics["choice"] = float(choice)
        return reply

    def updates(self, reply: Reply) -> list[tuple[Hashable, torch.Tensor]]:
        return [((id(self.centres), reply.choice), reply.update)]

    def check(self, reply: Reply) -> None:
        s, size = self.centres.shape
        check_tensor(reply, "update", (size,))
        u = check_tensor(reply, "importance", (s,))
        if bool((u <= 0).any()):
            raise InvalidReply("'importance' weights must be positive")
        check_metrics(reply, ["choice"])
        if reply.choice != int(u.argmax()):
            raise InvalidReply(f"choice {reply.metrics['choice']!r} is not the largest weight")
        if "noise_std" not in reply.metrics:
            check_metrics(reply, ["loss"])
        Task.check(self, reply)


@register_task
@dataclass
class EvaluateMixture(Task):
    """The objective's metrics, on the client's held-out data, of the mixture
    sum_k w_k p_k(y | x) of K models (rows of `models`) with the client's `weights` (K,): FedEM's
    prediction, FedRC's ensemble. The objective scores the mixture's log-probabilities (its
    cross-entropy is then -log sum_k w_k p_k(y | x))."""

    kind = "evaluate_mixture"
    counts_training_examples = False  # held-out samples
    models: torch.Tensor
    weights: torch.Tensor
    split: str = "test"

    @torch.no_grad()
    def run(self, runtime: ClientSide) -> Reply:
        training = runtime.routines
        x, y = held_out(runtime, self.client, self.split)
        parts = []
        for params, weight in zip(self.models, self.weights.double(), strict=True):
            if weight > 0:
                out = training.per_sample(runtime.load_eval(params), training.eval_layout(x), y,
                                          lambda o, t: {"logp": torch.log_softmax(o.double(), -1)})
                if out:
                    parts.append(out["logp"] + weight.log())
        stats = (runtime.objective.sample_stats(torch.logsumexp(torch.stack(parts), 0), y)
                 if parts else {})
        return Reply(self.client, {}, runtime.objective.summarise(stats), len(y))

    check = Evaluate.check


@register_task
@dataclass
class Responses(Task):
    """Softmax outputs of the sent model on server-provided `inputs` (DistFL-style probes)."""

    kind = "responses"
    counts_training_examples = False  # the server's probe inputs
    params: torch.Tensor
    inputs: torch.Tensor

    @torch.no_grad()
    def run(self, runtime: ClientSide) -> Reply:
        training = runtime.routines
        model = runtime.load_eval(self.params)
        model.eval()
        out = torch.softmax(model(training.eval_layout(self.inputs.to(runtime.dtype))), dim=-1)
        return Reply(self.client, {"responses": out}, {}, len(self.inputs))

    def check(self, reply: Reply) -> None:
        check_tensor(reply, "responses")
        Task.check(self, reply)


@torch.no_grad()
def attack_success(runtime: ClientSide, models: dict[int, torch.Tensor],
                   label_map: dict[int, int]) -> dict[int, tuple[int, int]]:
    """Per client: (test samples of a targeted class predicted as the attacker's target for it,
    test samples of a targeted class). Simulation only: it reads the clients' test labels."""
    training = runtime.routines
    out = {}
    for client, params in models.items():
        data = runtime.client_data(client)
        targeted = torch.isin(data.y_test, torch.tensor(list(label_map)))
        if not targeted.any():
            out[client] = (0, 0)
            continue
        x, y = data.x_test[targeted], data.y_test[targeted]
        predicted, _ = training.sample_losses(runtime.load_eval(params), training.eval_layout(x), y,
                                     runtime.objective)
        out[client] = (int((predicted == flip_labels(y, label_map)).sum()), len(y))
    return out
