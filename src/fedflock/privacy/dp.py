"""Differential privacy on the clients: the two mechanisms of `privacy.dp` and their accounting.

`client` (client-level DP, Geyer, Klein & Nabi 2017, the mechanism DistFL cites): a client clips
the whole update it releases, trainable parameters and BatchNorm statistics alike, to L2 norm C
and adds N(0, (σC)²) to every coordinate before the update leaves it. Masking, when on, is applied
after the noise: a permutation is post-processing and leaves isotropic noise isotropic, so the two
compose (the server still never sees an unnoised or unmasked update).

`dp-sgd` (example-level DP-SGD, Abadi et al. 2016): local training draws Poisson batches (each
sample kept with probability q = B/n), clips each sample's gradient to C, sums, adds N(0, (σC)²)
and divides by the expected batch size qn. What this uses Opacus for, and why not more:
`GradSampleModule` computes the per-sample gradients, `DPOptimizer.pre_step` clips, sums,
noises and scales them, `UniformWithReplacementSampler` draws the batches, and the RDP accountant
(`get_noise_multiplier`, `RDPAccountant`) turns (σ, q, steps) into ε. The SGD step itself stays
fedflock's `sgd_step`, so momentum, weight decay and FedProx's pull act as without DP;
`PrivacyEngine.make_private` is not used because it wants to own a DataLoader and the optimizer,
which would fork a second training loop next to the one every executor shares. DP-SGD runs on
the per-client path (the vmap executor trains those tasks one by one). Opacus refuses BatchNorm
(a sample's normalised value depends on the others in its batch), and so does fedflock: a BN
model under `dp-sgd` is a one-line config error that points to `client`.

Accounting. The mechanism runs on the clients so that the server, which receives each client's
noised update and chose which clients take part, is the adversary it protects against. Hence:
- `client`: client-level ("zero-out") adjacency, one client's data replaced by data that yield a
  zero update (Kairouz et al. 2021); each release is a Gaussian mechanism of sensitivity C, and
  the releases compose over the run with sample rate 1: sampling clients amplifies nothing
  against the party that did the sampling (it knows who was asked). The summary also gives the
  DP-FedAvg figure at rate q = sampled/all clients (`epsilon_if_sampling_secret`), which holds
  only for an observer of the aggregated models who does not learn who took part. Under
  replace-one adjacency (sensitivity 2C) the same noise gives the ε of σ/2.
- `dp-sgd`: add/remove-one-example adjacency within a client's data; the Poisson batches are the
  client's secret, so their amplification holds. A client's ε grows with its sample rate B/n:
  one σ is calibrated so that the smallest client meets the target, and the summary reports the
  maximum over clients (the guarantee) and the smallest.
Releases are counted as one per client per round, every round (exact under full participation,
an upper bound otherwise), plus what an algorithm declares (`Algorithm.releases`): final tasks
that release updates (e.g. fine-tuning). Opacus's RDP analysis assumes Poisson sampling; the
client mechanism's rate-1 accounting needs no sampling assumption.

Only updates are covered (train, gradient and select's training); other client releases are not
noised: example counts, select's scores and choice (IFCA, incremental's placements), per-sample
losses and data bases (FedRC, PACFL-style tasks). Under DP a training reply carries no training
loss (an unnoised statistic of private data) but the public noise std σC.
"""

from __future__ import annotations

import copy
import functools
import secrets
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from fedflock.config import DPConfig, TrainingConfig
from fedflock.errors import ConfigError
from fedflock.models.flat import FlatSpec

if TYPE_CHECKING:
    from opacus import GradSampleModule
    from opacus.optimizers import DPOptimizer

ACCOUNTANT = "rdp"
# Opacus's hint that a larger RDP order might give a tighter bound; the bound holds as it is.
LOOSE_ORDER = "Optimal order is the largest alpha"
COVERS = ("model updates (train, gradient, select's training, each model of a mixture), "
          "BatchNorm statistics included; not covered: example counts, select's scores and "
          "choice, per-sample losses, data bases, mixture weights and class masses")


def releases_of(rounds: int, algorithm: type | None, params: Any) -> int:
    """Update releases each client is accounted for: one per round plus what the algorithm
    declares (`Algorithm.releases`: final tasks that release an update, e.g. fine-tuning)."""
    return rounds if algorithm is None else algorithm.releases(params, rounds)


@functools.lru_cache(maxsize=4096)
def epsilon_spent(history: tuple[tuple[float, float, int], ...], delta: float) -> float:
    """ε after the releases of `history` ((σ, sample rate, steps), ...): Opacus's RDP
    accountant."""
    from opacus.accountants import RDPAccountant

    accountant = RDPAccountant()
    accountant.history = [entry for entry in history if entry[2] > 0]
    if not accountant.history:
        return 0.0
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=LOOSE_ORDER)
        return float(accountant.get_epsilon(delta=delta))


@functools.lru_cache(maxsize=256)
def calibrate(epsilon: float, delta: float, sample_rate: float, steps: int) -> float:
    """The noise multiplier that keeps `steps` releases at `sample_rate` within (ε, δ)
    (Opacus's search, tolerance 0.01 in ε); an unreachable ε is a `ConfigError`."""
    from opacus.accountants.utils import get_noise_multiplier

    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=LOOSE_ORDER)
            return float(get_noise_multiplier(target_epsilon=epsilon, target_delta=delta,
                                              sample_rate=sample_rate, steps=steps,
                                              accountant=ACCOUNTANT))
    except ValueError as err:
        raise ConfigError(f"config: privacy.dp.epsilon: {epsilon:g} is out of reach with delta "
                          f"{delta:g} over {steps} steps at sample rate {sample_rate:.4g} "
                          f"(opacus: {err}); raise epsilon or delta, or shorten the run") from None


def dpsgd_rate(n: int, batch_size: int) -> float:
    """Poisson sample rate of DP-SGD batches: the configured batch size over the client's data."""
    return min(1.0, batch_size / max(n, 1))


def dpsgd_steps(n: int, training: TrainingConfig, epochs: int | None = None) -> int:
    """DP-SGD steps of one local training (one "epoch" is n // B Poisson batches)."""
    if epochs is None and training.local_steps is not None:
        return training.local_steps
    per_epoch = max(1, n // training.batch_size)
    return (epochs or training.local_epochs or 1) * per_epoch


@dataclass(frozen=True)
class Plan:
    """How much noise the clients add and what it buys: the same on every client and in the
    summary, since both derive it from the config and the clients' example counts."""

    cfg: DPConfig
    releases: int
    sigma: float
    by_size: dict[int, tuple[float, int]]  # example count -> (sample rate, steps over the run)

    def epsilon(self, n: int) -> float:
        rate, steps = self.by_size[n]
        return epsilon_spent(((self.sigma, rate, steps),), self.cfg.delta)


def plan(cfg: DPConfig, training: TrainingConfig, sizes: Sequence[int], releases: int) -> Plan:
    """The noise multiplier (given, or calibrated to the target ε for the client whose
    guarantee is weakest) and the accounted (rate, steps) of every client size."""
    sizes = list(sizes) or [0]  # no count declared: the client mechanism does not need one
    if cfg.mechanism == "client":
        by_size = {n: (1.0, releases) for n in set(sizes)}
    else:
        by_size = {n: (dpsgd_rate(n, training.batch_size), releases * dpsgd_steps(n, training))
                   for n in set(sizes)}
    if cfg.noise_multiplier is not None:
        return Plan(cfg, releases, cfg.noise_multiplier, by_size)
    assert cfg.epsilon is not None
    if releases <= 0:
        raise ConfigError("config: privacy.dp.epsilon: the number of rounds is unknown here; "
                          "load the config through fedflock.validation (or give "
                          "noise_multiplier)")
    # The smallest client has the largest sample rate: calibrate on it, then make sure no other
    # size needs more noise (the rounding of n // B can reorder close sizes).
    order = sorted(by_size)
    sigma = calibrate(cfg.epsilon, cfg.delta, *by_size[order[0]])
    for n in order[1:]:
        if epsilon_spent(((sigma, *by_size[n]),), cfg.delta) > cfg.epsilon:
            sigma = max(sigma, calibrate(cfg.epsilon, cfg.delta, *by_size[n]))
    return Plan(cfg, releases, sigma, by_size)


def prepare(cfg: DPConfig, rounds: int, algorithm: type | None, params: Any) -> None:
    """Validation's part (it alone sees the whole config): record how many releases each
    client is accounted for, and refuse an unreachable client-level ε before anything runs."""
    cfg._releases = releases_of(rounds, algorithm, params)
    if cfg.mechanism == "client" and cfg.epsilon is not None:
        calibrate(cfg.epsilon, cfg.delta, 1.0, cfg._releases)


def accounting(cfg: DPConfig, training: TrainingConfig, sizes: Sequence[int], rounds: int,
               releases: int, per_round: int, num_clients: int) -> dict[str, Any]:
    """The `dp` block of summary.json: the run's ε (max over clients), δ, and how it was
    accounted."""
    import opacus

    p = plan(cfg, training, sizes, releases)
    eps = {n: p.epsilon(n) for n in p.by_size}
    worst = max(eps, key=lambda n: (eps[n], -n))
    rate, steps = p.by_size[worst]
    out: dict[str, Any] = {
        "mechanism": cfg.mechanism,
        "epsilon": round(eps[worst], 4),
        "delta": cfg.delta,
        "target_epsilon": cfg.epsilon,
        "noise_multiplier": round(p.sigma, 6),
        "clip": cfg.clip,
        "accountant": f"RDP (opacus {opacus.__version__})",
        "sample_rate": round(rate, 6),
        "steps": steps,
        "releases_per_client": releases,
        "rounds": rounds,
        "noise": cfg.noise,
        "covers": COVERS,
    }
    if cfg.mechanism == "client":
        out["adjacency"] = ("client-level (one client's data replaced by data giving a zero "
                            "update); against the server, which knows who took part: rate 1, "
                            "every round counted")
        if per_round < num_clients:
            history = ((p.sigma, per_round / num_clients, rounds),
                       (p.sigma, 1.0, releases - rounds))
            out["epsilon_if_sampling_secret"] = {
                "epsilon": round(epsilon_spent(history, cfg.delta), 4),
                "sample_rate": round(per_round / num_clients, 6),
                "holds_for": "an observer of the aggregated models who does not learn which "
                             "clients took part (DP-FedAvg accounting), not the server"}
    else:
        out["adjacency"] = ("example-level (one training example of a client added or "
                            "removed); Poisson batches at rate B/n; epsilon is the maximum over "
                            "clients (the smallest client's)")
        out["epsilon_min"] = round(min(eps.values()), 4)
        out["examples_of_worst_client"] = worst
    return out


class ClientDP:
    """A client's side of the mechanism, built by the client runtime from the config."""

    def __init__(self, cfg: DPConfig, training: TrainingConfig, model: nn.Module, spec: FlatSpec,
                 sizes: Sequence[int], model_name: str = "model") -> None:
        self.cfg = cfg
        self.training = training
        if cfg.mechanism == "dp-sgd":
            _check_dpsgd_model(model, spec, model_name)
        self.plan = plan(cfg, training, sizes, cfg._releases or 0)
        self.sigma = self.plan.sigma
        self._module: GradSampleModule | None = None
        self._inner: nn.Module | None = None
        variances = [name.endswith("running_var") for name in spec.names]
        mask = [torch.full((shape.numel(),), v) for v, shape in zip(variances, spec.shapes,
                                                                    strict=True)]
        self._variances = torch.cat(mask) if any(variances) else None

    @property
    def noise_std(self) -> float:
        """σ·C: the std of the noise on each released coordinate (`client`) or on each step's
        summed gradient (`dp-sgd`); public, it replaces the training loss in replies."""
        return self.sigma * self.cfg.clip

    @property
    def per_sample(self) -> bool:
        """DP-SGD: the noise goes into every local step, not onto the released update."""
        return self.cfg.mechanism == "dp-sgd"

    def generator(self, seed: int) -> torch.Generator:
        """The noise source of one release: seeded from (seed, round, client) for reproducible
        simulations, or from a secret the server never learns."""
        return torch.Generator().manual_seed(
            secrets.randbits(63) if self.cfg.noise == "secret" else seed)

    # -- client-level --------------------------------------------------------------------------
    def release(self, update: torch.Tensor, seed: int, start: torch.Tensor | None = None
                ) -> torch.Tensor:
        """What the client sends instead of `update`: under `client` the whole vector clipped to
        norm C plus N(0, (σC)²) per coordinate; under `dp-sgd` the update as trained (its noise
        is already in every step).

        With `start` (the model the update applies to), the noised BatchNorm running variances
        of `start + update` are clamped at 0: noise can make them negative and the model's
        normalisation NaN, on the server too (DistFL reads uploaded models). Post-processing of
        the noised vector with what the server sent: no privacy cost. Averages of valid models
        stay valid, so the server's models keep non-negative variances."""
        if self.per_sample:
            return update
        noised = clip_and_noise(update, self.cfg.clip, self.sigma, self.generator(seed))
        if start is None or self._variances is None:
            return noised
        return torch.where(self._variances, (start + noised).clamp_min(0) - start, noised)

    def project(self, vector: torch.Tensor) -> torch.Tensor:
        """A received model with BatchNorm running variances clamped at 0 (a safety net for
        server steps that are not averages). Post-processing on the client: no privacy cost."""
        if self._variances is None or self.per_sample:
            return vector
        return torch.where(self._variances, vector.clamp_min(0), vector)

    # -- DP-SGD --------------------------------------------------------------------------------
    def module(self, model: nn.Module) -> GradSampleModule:
        """Opacus's per-sample-gradient wrapper around a private copy of `model` (the runtime's
        own copy stays hook-free for every other task)."""
        if self._module is None:
            from opacus import GradSampleModule

            self._inner = copy.deepcopy(model)
            self._module = GradSampleModule(self._inner, loss_reduction="sum")
        return self._module

    @property
    def inner(self) -> nn.Module:
        """The copy of the model inside `module` (its parameter names are the model's)."""
        assert self._inner is not None, "call module() first"
        return self._inner

    def local_steps(self, n: int, epochs: int | None = None) -> int:
        return dpsgd_steps(n, self.training, epochs)

    def optimizer(self, params: list[nn.Parameter], n: int, seed: int) -> DPOptimizer:
        """Opacus's clipping and noise for one local training. The wrapped SGD is never stepped:
        `pre_step` leaves the noised mean gradient in `.grad` for fedflock's own SGD step."""
        from opacus.optimizers import DPOptimizer

        expected = max(1, round(dpsgd_rate(n, self.training.batch_size) * n))
        return DPOptimizer(torch.optim.SGD(params, lr=self.training.lr),
                           noise_multiplier=self.sigma, max_grad_norm=self.cfg.clip,
                           expected_batch_size=expected, loss_reduction="mean",
                           generator=self.generator(seed),
                           secure_mode=self.cfg.noise == "secret")

    def batches(self, n: int, seed: int, steps: int) -> list[torch.Tensor]:
        """Poisson batches (Opacus's sampler): each sample in each batch with probability B/n,
        so batch sizes vary and may be 0, as the accountant assumes."""
        from opacus.utils.uniform_sampler import UniformWithReplacementSampler

        sampler = UniformWithReplacementSampler(
            num_samples=n, sample_rate=dpsgd_rate(n, self.training.batch_size),
            generator=torch.Generator().manual_seed(seed), steps=steps)
        return [torch.tensor(b, dtype=torch.long) for b in sampler]


def clip_and_noise(update: torch.Tensor, clip: float, sigma: float,
                   generator: torch.Generator) -> torch.Tensor:
    """The Gaussian mechanism on one vector: scaled to L2 norm at most `clip`, plus
    N(0, (sigma·clip)²) on every coordinate."""
    norm = float(torch.linalg.vector_norm(update, dtype=torch.float64))
    clipped = update * min(1.0, clip / norm) if norm > 0 else update
    noise = torch.normal(0.0, sigma * clip, size=update.shape, generator=generator,
                         dtype=update.dtype)
    return clipped + noise


def _check_dpsgd_model(model: nn.Module, spec: FlatSpec, name: str) -> None:
    """Opacus's validator, as one config line: per-sample gradients need layers that treat
    samples independently (no BatchNorm), and every released number must be trained by it
    (no buffers, which DP-SGD would release unnoised)."""
    from opacus.validators import ModuleValidator

    batch_norm = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    if batch_norm:
        raise ConfigError(
            f"config: privacy.dp.mechanism: dp-sgd cannot train {name!r}: it has BatchNorm, "
            "which mixes the samples of a batch (Opacus refuses it); use mechanism: client, "
            "which clips and noises each whole update, BN statistics included")
    errors = ModuleValidator.validate(model, strict=False)
    if errors:
        first = str(errors[0]).split(". ")[0]
        raise ConfigError(f"config: privacy.dp.mechanism: dp-sgd cannot train {name!r}: "
                          f"{first} (Opacus); use mechanism: client")
    if spec.has_buffers:
        raise ConfigError(f"config: privacy.dp.mechanism: dp-sgd cannot train {name!r}: its "
                          "buffers would be released without noise; use mechanism: client")
