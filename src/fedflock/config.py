"""Experiment configuration: YAML validated into typed objects.

Every user error becomes one `ConfigError` line naming the key and what was expected.
"""

from __future__ import annotations

import copy
import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    model_validator,
)

from fedflock.errors import ConfigError


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


MAX_SEED = 2**63 - 1  # seeds are non-negative 64-bit integers (torch, numpy)
MAX_WIDTH = 65536  # a wider hidden layer is a typo, not a model this tool trains

BUILTIN_SCENARIOS = ("iid", "label_permutation", "label_swap", "rotation", "feature_skew",
                     "category_imbalance", "environment", "dirichlet", "shards",
                     "quantity_skew", "natural", "topics")


class ScenarioConfig(_Strict):
    """How client data are split and how the hidden groups differ.

    `kind` is either a group shift (iid, label_permutation, label_swap, rotation, feature_skew,
    category_imbalance, environment), whose samples inside each group are split by
    `partition`, or a pure label/quantity skew
    (dirichlet, shards, quantity_skew) with a single hidden group, or `natural` (one client per
    writer of a LEAF dataset).
    """

    kind: str = Field("iid", description="a built-in kind (BUILTIN_SCENARIOS) or one a plugin "
                      "registered (checked in fedflock.validation)")
    groups: int = Field(1, ge=1)
    partition: Literal["iid", "dirichlet", "shards", "quantity_skew"] = "iid"
    alpha: float = Field(0.5, gt=0, description="Dirichlet concentration")
    classes_per_client: int = Field(2, ge=1, description="classes per client for shards")
    quantity_sigma: float = Field(1.0, gt=0, description="log-normal sigma for quantity_skew")
    swap_pairs: int | None = Field(None, ge=1, description="label pairs swapped per group")
    transforms: list[Literal["none", "noise", "brightness", "invert", "contrast"]] = Field(
        default_factory=lambda: ["none", "invert", "noise", "brightness", "contrast"],
        description="feature_skew: group k applies transforms[k] (one distinct entry per group)",
    )
    noise_std: float = Field(0.5, ge=0)
    options: dict[str, Any] = Field(default_factory=dict,
                                    description="parameters of a plugin's own scenario")


class TextConfig(_Strict):
    """How a text dataset becomes token sequences (ignored by image and sensor datasets)."""

    vocab_size: int = Field(5000, ge=4, le=1_000_000, description="most frequent units kept "
                            "by the tokenizer fitted on the clients' training text; rarer ones "
                            "become [UNK]. Larger models more words and costs an output row each")
    seq_len: int = Field(32, ge=2, le=4096, description="tokens per training sequence (the "
                         "truncated back-propagation length); longer gives more context")
    group_by: Literal["play", "genre"] = Field("play", description="shakespeare with "
                                               "`natural`: the hidden group a role's "
                                               "clustering is scored against, its play or its "
                                               "play's Folio kind (comedy, history, tragedy)")


class DataConfig(_Strict):
    dataset: str = "mnist5k"
    root: Path | None = None
    clients: int = Field(20, ge=1)
    samples_per_client: int | None = Field(None, ge=1)
    test_per_client: int | None = Field(None, ge=1)
    scenario: ScenarioConfig = Field(default_factory=ScenarioConfig)
    text: TextConfig = Field(default_factory=TextConfig)

    @model_validator(mode="after")
    def _groups_fit(self) -> DataConfig:
        sc = self.scenario
        if sc.groups > self.clients:
            raise ValueError(
                f"scenario.groups ({sc.groups}) must not exceed clients ({self.clients})"
            )
        if sc.options and sc.kind in BUILTIN_SCENARIOS:
            raise ValueError(f"scenario.options: parameters of a plugin's own scenario; the "
                             f"built-in {sc.kind!r} takes its parameters as scenario keys")
        if sc.kind == "feature_skew" and len(set(sc.transforms[: sc.groups])) < sc.groups:
            raise ValueError(f"scenario.transforms: feature_skew with {sc.groups} groups needs "
                             f"{sc.groups} distinct transforms, one per group")
        return self

    def resolved_root(self) -> Path | None:
        if self.root is not None:
            return self.root
        env = os.environ.get("FEDFLOCK_DATA")
        return Path(env) if env else None


class ModelConfig(_Strict):
    name: str = "mlp"
    hidden: list[Annotated[int, Field(ge=1, le=MAX_WIDTH)]] = Field(
        default_factory=lambda: [100], description="hidden layer widths (models that use them)")
    width: float = Field(1.0, gt=0, le=4, description="channel multiplier of vgg11_bn, resnet18 "
                         "and cnn1d_bn (each layer keeps at least one channel); 0.25 makes "
                         "vgg11_bn and resnet18 CPU-practical")
    embedding: int = Field(64, ge=1, le=MAX_WIDTH, description="lstm_lm, transformer_lm: "
                           "width of the token embedding (the Transformer's model width)")
    layers: int = Field(2, ge=1, le=64, description="lstm_lm, transformer_lm: stacked LSTM "
                        "layers or Transformer blocks")
    heads: int = Field(4, ge=1, le=256, description="transformer_lm: attention heads (they "
                       "must divide model.embedding)")
    tied: bool = Field(False, description="lstm_lm, transformer_lm: the output layer shares "
                       "the embedding's weights (fewer parameters to send each round)")
    dual_encoder: bool = Field(False, description="two copies of the model's feature layers "
                               "(all but its last linear layer), their features concatenated "
                               "before one classifier; FedDAG shares the second copy with "
                               "complementary clusters")


class TrainingConfig(_Strict):
    local_epochs: int | None = Field(1, ge=1)
    local_steps: int | None = Field(None, ge=1, description="overrides local_epochs when set")
    lr: float = Field(0.1, gt=0)
    momentum: float = Field(0.0, ge=0, lt=1)
    weight_decay: float = Field(0.0, ge=0)
    batch_size: int = Field(32, ge=1)
    executor: Literal["auto", "sequential", "batched", "processes"] = "auto"
    workers: int | None = Field(None, ge=1)
    dtype: Literal["float32", "float64"] = "float32"

    @model_validator(mode="after")
    def _some_local_work(self) -> TrainingConfig:
        if self.local_epochs is None and self.local_steps is None:
            raise ValueError("give local_epochs or local_steps (both are null)")
        return self


class AlgorithmConfig(BaseModel):
    """`name` plus the algorithm's own parameters, validated by that algorithm."""

    model_config = ConfigDict(extra="allow")
    name: str = "fedavg"

    def params(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


class ParticipationConfig(_Strict):
    """Clients sampled per round (seeded): `fraction` of them, or exactly `count` when given."""

    fraction: float = Field(1.0, gt=0, le=1)
    count: int | None = Field(None, ge=1)

    @model_validator(mode="after")
    def _one_rate(self) -> ParticipationConfig:
        if self.count is not None and self.fraction != 1.0:
            raise ValueError(f"give fraction ({self.fraction}) or count ({self.count}), not "
                             "both")
        return self

    def per_round(self, num_clients: int) -> int:
        k = self.count if self.count is not None else max(1, round(self.fraction * num_clients))
        return min(k, num_clients)


MODEL_POISONING = ("sign_flip", "zero", "random", "model_replacement")
DATA_POISONING = ("label_flip", "model_replacement")


class AttackConfig(_Strict):
    """Malicious clients (a seeded `fraction` of all clients, up to a majority).

    Model poisoning changes what a malicious client sends: `sign_flip` (the opposite of its honest
    update, times `scale`), `zero`, `random` (Gaussian noise of `scale` times the honest norm),
    `model_replacement` (trains on flipped labels and boosts its update by `scale`, by default
    sampled clients / malicious sampled clients, so that it replaces the aggregate).
    Data poisoning: `label_flip` trains on labels mapped by `label_map` (default 0-3 <-> 4-7).
    `colluding` attackers send one common vector per round (their mean, or one shared noise
    draw). Every attack starts at `start_round`: before it, malicious clients train and send
    honestly (sleepers).
    """

    kind: Literal["sign_flip", "zero", "random", "model_replacement", "label_flip"]
    fraction: float = Field(gt=0, lt=1)
    colluding: bool = False
    scale: float | None = Field(None, gt=0)
    label_map: dict[int, int] = Field(
        default_factory=lambda: {0: 4, 1: 5, 2: 6, 3: 7, 4: 0, 5: 1, 6: 2, 7: 3})
    start_round: int = Field(1, ge=1)

    @property
    def poisons_data(self) -> bool:
        return self.kind in DATA_POISONING

    @property
    def poisons_model(self) -> bool:
        return self.kind in MODEL_POISONING


class DPConfig(_Strict):
    """Differential privacy on the clients (`fedflock.privacy.dp` says how it is accounted).

    `dp-sgd`: every local step clips each sample's gradient to `clip` and adds Gaussian noise
    (Opacus); example-level privacy of each client's data. `client`: each released update is
    clipped to norm `clip` as a whole (BN statistics included) and noised on the client
    (Geyer et al. 2017); client-level privacy. Give the whole run's target `epsilon` (the noise
    multiplier is derived with Opacus's RDP accountant) or `noise_multiplier` directly.
    """

    mechanism: Literal["dp-sgd", "client"]
    epsilon: float | None = Field(None, gt=0, description="target ε for the whole run")
    noise_multiplier: float | None = Field(None, gt=0, description="σ: noise std = σ × clip")
    delta: float = Field(1e-5, gt=0, lt=1)
    clip: float = Field(1.0, gt=0, description="clipping norm C (per sample or per update)")
    noise: Literal["seeded", "secret"] = Field(
        "seeded", description="seeded: noise drawn from (seed, round, client), reproducible, "
        "simulation only (whoever knows the config can recompute it); secret: a seed the "
        "server never learns, for deployments")
    # Update releases each client is accounted for (rounds plus an algorithm's final releases):
    # set by fedflock.validation, which sees the whole config; never read from YAML.
    _releases: int | None = None

    @model_validator(mode="after")
    def _one_noise_source(self) -> DPConfig:
        if (self.epsilon is None) == (self.noise_multiplier is None):
            raise ValueError("give either epsilon (the target for the whole run) or "
                             "noise_multiplier, not both")
        return self


class PrivacyConfig(_Strict):
    masking: bool = False
    mask_seed: int = Field(12345, description="shared by clients only, never used by the server")
    dp: DPConfig | None = Field(None, description="differential privacy on the clients")


class ServerConfig(_Strict):
    """Checks the server makes of every reply beyond its task's own (dtype, shape, finite,
    declared example count: always on)."""

    norm_bound: float | None = Field(
        100.0, gt=1, description="refuse an update whose norm exceeds this multiple of the "
        "median norm of the updates computed from the same model in its round (groups of 3 or "
        "more); null turns it off (the papers' setting)")


class ExperimentConfig(_Strict):
    seed: int = Field(0, ge=0, le=MAX_SEED)
    rounds: int = Field(50, ge=1)
    engine: Literal["embedded", "flower"] = "embedded"
    data: DataConfig = Field(default_factory=DataConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    training: TrainingConfig = Field(default_factory=TrainingConfig)
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    participation: ParticipationConfig = Field(default_factory=ParticipationConfig)
    attack: AttackConfig | None = None
    privacy: PrivacyConfig = Field(default_factory=PrivacyConfig)
    server: ServerConfig = Field(default_factory=ServerConfig)
    checkpoint_every: int = Field(10, ge=1)
    eval_every: int = Field(1, ge=1)
    eval_mode: Literal["auto", "separate", "with_training"] = Field(
        "auto", description="how rounds before the last are evaluated: 'separate' (every "
        "client scores its model after the round's aggregation, one message each), "
        "'with_training' (each sampled client scores the model it receives, before training, "
        "in its training message: one message per client and round), 'auto' (with_training "
        "on Flower, separate on the embedded engine). The last round is always evaluated "
        "separately, so summary.json is the same in every mode")

    @model_validator(mode="after")
    def _attack_within_the_run(self) -> ExperimentConfig:
        attack = self.attack
        if attack is not None and attack.start_round > self.rounds:
            raise ValueError(f"attack.start_round: round {attack.start_round} is after the "
                             f"last round ({self.rounds}), so the attack would never happen")
        return self


def format_validation_error(err: ValidationError, prefix: str = "") -> str:
    """The first validation problem as one line: `config: key.path: message (got value)`."""
    first = err.errors()[0]
    loc = ".".join(str(p) for p in (prefix.split(".") if prefix else []) + list(first["loc"]))
    msg = first["msg"].removeprefix("Value error, ")
    if first["type"] == "extra_forbidden":
        msg = "unknown key"
    got = first.get("input")
    key = re.match(r"([A-Za-z_]\w*(?:\.\w+)*): ", msg)
    # a section's own check names the key it is about
    if key and isinstance(got, dict) and key.group(1).split(".")[0] in got:
        loc, msg = ".".join(filter(None, [loc, key.group(1)])), msg[key.end():]
    shown = "" if isinstance(got, dict | list) or got is None else f" (got {got!r})"
    more = len(err.errors()) - 1
    suffix = f" [+{more} more]" if more else ""
    return f"config: {loc + ': ' if loc else ''}{msg}{shown}{suffix}"


def parse_value(text: str) -> Any:
    """Parse a `--set` value with YAML rules (numbers, booleans, lists)."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """A copy of a raw config mapping with `key.path=value` overrides applied (the caller's
    mapping is left as it was)."""
    raw = copy.deepcopy(raw)
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"--set {item!r}: expected key.path=value")
        path, value = item.split("=", 1)
        keys = path.strip().split(".")
        if not all(key.strip() for key in keys):
            raise ConfigError(f"--set {item!r}: expected key.path=value (an empty key)")
        node = raw
        for key in keys[:-1]:
            child = node.setdefault(key, {})
            if not isinstance(child, dict):
                raise ConfigError(f"--set {path}: {key!r} is not a section")
            node = child
        node[keys[-1]] = parse_value(value)
    return raw


def load_raw(path: Path) -> dict[str, Any]:
    if path.is_dir():
        raise ConfigError(f"{path} is a folder, not a config file")
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"config {path}: not a UTF-8 text file") from None
    except OSError as err:
        raise ConfigError(f"config {path}: cannot read ({err.strerror})") from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        line = getattr(getattr(exc, "problem_mark", None), "line", None)
        where = f" line {line + 1}" if line is not None else ""
        raise ConfigError(f"config {path}{where}: not valid YAML") from None
    if raw is None:
        raise ConfigError(f"config {path}: empty; give at least the keys that differ from the "
                          "defaults (e.g. `algorithm: {name: cfl}`)")
    if not isinstance(raw, dict):
        raise ConfigError(f"config {path}: expected a mapping at the top level")
    return raw


def parse_config(raw: dict[str, Any]) -> ExperimentConfig:
    """The structure and values of a raw config (names of registered components are checked
    one layer up, by `fedflock.validation.validate`: this module imports no registry)."""
    try:
        return ExperimentConfig.model_validate(raw)
    except ValidationError as err:
        raise ConfigError(format_validation_error(err)) from None


def dump_config(config: ExperimentConfig) -> str:
    data = config.model_dump(mode="json")
    return yaml.safe_dump(data, sort_keys=False)
