"""Differential privacy on the clients (`privacy.dp`): every algorithm runs under it, the
mechanisms do what they claim (clipping, noise scale, per-sample clipping in DP-SGD), the
reported ε is Opacus's accountant's, and user errors are one line."""

from __future__ import annotations

import pytest
import torch
import yaml
from opacus.accountants import RDPAccountant
from torch.func import functional_call, grad, vmap

from fedflock.algorithms import ALGORITHMS, validate_params
from fedflock.api import run
from fedflock.client.executors import EXECUTORS
from fedflock.client.runtime import ClientRuntime
from fedflock.client.tasks import Gradient, Train
from fedflock.compare import markdown_table, summarise
from fedflock.data.scenarios import build_federated_data
from fedflock.errors import ConfigError
from fedflock.privacy.dp import clip_and_noise, dpsgd_steps, plan
from fedflock.validation import validate
from tests.conftest import one_error_line, small_config
from tests.test_algorithm_contract import MODEL, QUICK


def _dp(mechanism: str = "client", **dp: object) -> dict:
    return {"privacy.dp": {"mechanism": mechanism, **(dp or {"epsilon": 8.0})}}


def _runtime(raw: dict) -> ClientRuntime:
    cfg = validate(raw)
    return ClientRuntime(build_federated_data(cfg.data, cfg.seed), cfg.model, cfg.training,
                         cfg.seed, cfg.privacy)


def _epsilon(sigma: float, rate: float, steps: int, delta: float) -> float:
    accountant = RDPAccountant()
    accountant.history = [(sigma, rate, steps)]
    return accountant.get_epsilon(delta=delta)


@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_every_algorithm_runs_two_rounds_under_client_level_dp(name: str) -> None:
    raw = small_config(**{"rounds": 2, "algorithm": {"name": name, **QUICK.get(name, {})},
                          **_dp("client", epsilon=3.0, clip=0.5)},
                       **({"model": MODEL[name]} if name in MODEL else {}))
    summary = run(raw).summary
    dp = summary["dp"]
    assert dp["mechanism"] == "client" and dp["delta"] == 1e-5
    assert 2.9 <= dp["epsilon"] <= 3.0, dp
    cls, params = ALGORITHMS.get(name), validate_params(validate(raw).algorithm)
    # one update a round plus the final ones; a mixture releases one per model and round
    per_round = getattr(params, "clusters", 1) if name in ("fedem", "fedrc") else 1
    assert dp["releases_per_client"] == 2 * per_round + cls.final_releases
    members = sorted(c for part in summary["clusters"] for c in part)
    assert members == list(range(6))
    assert not summary.get("rejected_replies"), summary.get("rejected_replies")
    values = summary["accuracy"]["per_client"]
    assert all(v is not None and 0 <= v <= 1 for v in values), values


def test_released_update_is_clipped_before_the_noise() -> None:
    update = torch.randn(5000, generator=torch.Generator().manual_seed(1)) * 3
    gen = lambda: torch.Generator().manual_seed(7)  # noqa: E731 (same noise twice)
    noised = clip_and_noise(update, 0.5, 2.0, gen())
    noise_only = clip_and_noise(torch.zeros_like(update), 0.5, 2.0, gen())
    clipped = noised - noise_only
    assert torch.linalg.vector_norm(clipped) == pytest.approx(0.5, rel=1e-4)
    assert torch.nn.functional.cosine_similarity(clipped, update, dim=0) > 0.9999
    small = update / torch.linalg.vector_norm(update) * 0.1  # inside the ball: unchanged
    assert torch.allclose(clip_and_noise(small, 0.5, 2.0, gen()) - noise_only, small, atol=1e-5)


def test_secret_noise_is_not_reproducible_seeded_noise_is() -> None:
    seeded = _runtime(small_config(**_dp("client", noise_multiplier=1.0))).dp
    secret = _runtime(small_config(**_dp("client", noise_multiplier=1.0, noise="secret"))).dp
    assert seeded is not None and secret is not None
    zero = torch.zeros(100)
    assert torch.equal(seeded.release(zero, 5), seeded.release(zero, 5))
    assert not torch.equal(secret.release(zero, 5), secret.release(zero, 5))


def test_noise_std_is_sigma_times_clip() -> None:
    runtime = _runtime(small_config(**_dp("client", noise_multiplier=1.7, clip=0.3)))
    assert runtime.dp is not None
    noise = runtime.dp.release(torch.zeros(200_000), seed=3)
    assert float(noise.mean()) == pytest.approx(0.0, abs=0.01)
    assert float(noise.std()) == pytest.approx(1.7 * 0.3, rel=0.01)


def test_the_server_receives_a_clipped_noised_update_without_loss_bn_included() -> None:
    """Train replies leave the client clipped (the whole vector, BN statistics included) and
    noised, and without the training loss."""
    raw = small_config(**{"model.name": "cnn_bn",
                          **_dp("client", noise_multiplier=1e-6, clip=0.01)})
    runtime = _runtime(raw)
    start = runtime.initial_params()
    plain = ClientRuntime(runtime.data, runtime.model_cfg, runtime.training, 0)
    [reference] = plain.run([Train(0, 1, start)])
    [reply] = runtime.run([Train(0, 1, start)])
    assert runtime.spec.has_buffers
    assert reply.metrics == {"noise_std": pytest.approx(1e-8)}  # no training loss
    Train(0, 1, start).check(reply)  # the server accepts it
    full = torch.linalg.vector_norm(reference.update)
    buffers = torch.linalg.vector_norm(reference.update[runtime.spec.num_trainable :])
    assert full > 1 and buffers > 0.01  # clipping has work to do, on buffers too
    assert float(torch.linalg.vector_norm(reply.update)) == pytest.approx(0.01, rel=1e-2)
    cosine = torch.nn.functional.cosine_similarity(reply.update, reference.update, dim=0)
    assert cosine > 0.999


def test_noised_batchnorm_variances_stay_valid_on_the_server() -> None:
    """Noise on running variances would make them negative (NaN normalisation in every model
    the server builds from uploads, DistFL's included); the client clamps start + update."""
    runtime = _runtime(small_config(**{"model.name": "cnn_bn",
                                       **_dp("client", noise_multiplier=5.0)}))
    start = runtime.initial_params()
    [reply] = runtime.run([Train(0, 1, start)])
    names = runtime.spec.split(start + reply.update)
    variances = [v for k, v in names.items() if k.endswith("running_var")]
    assert variances and all((v >= 0).all() for v in variances)
    means = [v for k, v in runtime.spec.split(reply.update).items() if k.endswith("running_mean")]
    assert any((v < 0).any() for v in means)  # only the variances are projected


def test_reported_epsilon_is_opacus_rdp_accountant_for_both_mechanisms() -> None:
    client = run(small_config(**{"rounds": 3, **_dp("client", noise_multiplier=1.3)}))
    dp = client.summary["dp"]
    assert dp["sample_rate"] == 1.0 and dp["steps"] == 3
    assert dp["epsilon"] == pytest.approx(_epsilon(1.3, 1.0, 3, 1e-5), abs=1e-4)

    raw = small_config(**{"rounds": 2, "training.batch_size": 8,
                          **_dp("dp-sgd", noise_multiplier=1.1)})
    dp = run(raw).summary["dp"]
    n = 40  # samples_per_client: every client has the same rate B/n
    steps = 2 * dpsgd_steps(n, validate(raw).training)
    assert dp["sample_rate"] == pytest.approx(8 / n) and dp["steps"] == steps == 2 * 5
    assert dp["epsilon"] == pytest.approx(_epsilon(1.1, 8 / n, steps, 1e-5), abs=1e-4)


def test_dp_sgd_noise_is_calibrated_on_the_client_with_the_weakest_guarantee() -> None:
    """Unequal clients: one σ, set so that the smallest (largest rate B/n) meets the target."""
    training = validate(small_config(**{"training.batch_size": 32})).training
    cfg = validate(small_config(**{"rounds": 3, **_dp("dp-sgd", epsilon=4.0)})).privacy.dp
    assert cfg is not None
    p = plan(cfg, training, [16, 64, 64], releases=3)
    assert p.by_size[16] == (1.0, 3) and p.by_size[64] == (0.5, 6)
    worst = max(p.epsilon(16), p.epsilon(64))
    assert 3.99 <= worst <= 4.0 and min(p.epsilon(16), p.epsilon(64)) < worst


def test_partial_participation_reports_the_sampling_secret_figure_apart() -> None:
    raw = small_config(**{"rounds": 2, "participation.fraction": 0.5,
                          **_dp("client", noise_multiplier=1.0)})
    dp = run(raw).summary["dp"]
    assert dp["epsilon"] == pytest.approx(_epsilon(1.0, 1.0, 2, 1e-5), abs=1e-4)
    secret = dp["epsilon_if_sampling_secret"]
    assert secret["epsilon"] == pytest.approx(_epsilon(1.0, 0.5, 2, 1e-5), abs=1e-4)
    assert secret["epsilon"] < dp["epsilon"]


def test_dp_sgd_clips_every_sample_gradient_not_the_batch() -> None:
    """With (almost) no noise and every sample in the batch, one DP-SGD step is exactly
    -lr/n · Σ_i g_i·min(1, C/‖g_i‖) with per-sample gradients g_i from torch.func."""
    clip = 0.05
    raw = small_config(**{"training.dtype": "float64", "training.batch_size": 64,
                          **_dp("dp-sgd", noise_multiplier=1e-9, clip=clip)})
    runtime = _runtime(raw)
    data = runtime.client_data(0)
    x, y = data.x_train, data.y_train
    start = runtime.initial_params()
    [reply] = runtime.run([Gradient(0, 1, start)])  # one step, rate 1: the whole client

    names = runtime.spec.names[: runtime.spec.num_params]
    params = {k: v for k, v in runtime.spec.split(start).items() if k in names}

    def loss(p: dict, xi: torch.Tensor, yi: torch.Tensor) -> torch.Tensor:
        out = functional_call(runtime.model, p, (xi[None],))
        return runtime.objective.losses(out, yi[None]).sum()

    per = vmap(grad(loss), in_dims=(None, 0, 0))(params, x, y)
    flat = torch.cat([per[k].reshape(len(y), -1) for k in names], dim=1)
    norms = torch.linalg.vector_norm(flat, dim=1)
    assert (norms > clip).all()  # every sample is clipped: the batch mean would not be
    expected = -runtime.training.lr * (flat * (clip / norms)[:, None]).sum(0) / len(y)
    assert torch.allclose(reply.update[: runtime.spec.num_trainable], expected, atol=1e-7)
    # Each sample moves the update by at most lr·C/n, whatever its gradient.
    assert float(torch.linalg.vector_norm(expected)) <= runtime.training.lr * clip + 1e-9
    batch_clipped = flat.mean(0) * min(1.0, clip / float(torch.linalg.vector_norm(flat.mean(0))))
    assert not torch.allclose(-runtime.training.lr * batch_clipped, expected, atol=1e-4)


def test_dp_sgd_training_uses_poisson_batches_and_replies_without_loss() -> None:
    runtime = _runtime(small_config(**_dp("dp-sgd", noise_multiplier=1.0)))
    [reply] = runtime.run([Train(0, 1, runtime.initial_params())])
    assert set(reply.metrics) == {"noise_std"} and torch.isfinite(reply.update).all()
    assert runtime.dp is not None
    batches = runtime.dp.batches(40, seed=1, steps=50)
    sizes = torch.tensor([len(b) for b in batches], dtype=torch.float64)
    assert len(set(sizes.tolist())) > 1  # Poisson, not fixed-size
    assert float(sizes.mean()) == pytest.approx(16, rel=0.2)


def test_batched_executor_noises_like_the_sequential_loop() -> None:
    raw = small_config(**{"training.dtype": "float64", **_dp("client", noise_multiplier=0.5)})
    runtime = _runtime(raw)
    tasks = [Train(c, 2, runtime.initial_params()) for c in range(4)]
    sequential = runtime.run(tasks)
    with EXECUTORS.get("batched")(runtime) as executor:
        batched = executor.run(tasks)
    for a, b in zip(sequential, batched, strict=True):
        assert a.metrics == b.metrics == {"noise_std": 0.5}
        assert torch.allclose(a.update, b.update, atol=1e-9)


def test_masking_composes_with_dp() -> None:
    """Noise before the permutation: the masked run's models are the plain run's, permuted, so
    every client scores the same."""
    base = small_config(**{"rounds": 1, **_dp("client", noise_multiplier=0.8)})
    plain = run(base).summary
    masked = run(small_config(**{"rounds": 1, "privacy.masking": True,
                                 **_dp("client", noise_multiplier=0.8)})).summary
    assert masked["dp"]["epsilon"] == plain["dp"]["epsilon"]
    assert masked["accuracy"]["per_client"] == plain["accuracy"]["per_client"]


def test_compare_table_shows_epsilon() -> None:
    summary = run(small_config(**{"rounds": 1, **_dp("client", epsilon=2.0)})).summary
    row = summarise("fedavg", [summary])
    table = markdown_table([row], [0])
    assert "DP ε" in table.splitlines()[2]
    assert f"{summary['dp']['epsilon']:.2f}" in table.splitlines()[4]
    assert "max" in table and "δ = 1e-05" in table


def test_config_errors_are_one_line(tmp_path, cli) -> None:
    def write(**overrides: object):
        path = tmp_path / "c.yaml"
        path.write_text(yaml.safe_dump(small_config(**overrides)))
        return str(path)

    out = str(tmp_path / "out")
    one_error_line(*cli("run", write(rounds=50, **_dp("client", epsilon=0.01)), "--out", out),
                   "privacy.dp.epsilon", "out of reach")
    one_error_line(*cli("run", write(**{"model.name": "cnn_bn", **_dp("dp-sgd")}), "--out",
                        out), "dp-sgd", "BatchNorm", "mechanism: client")
    one_error_line(*cli("run", write(**_dp("client", epsilon=1.0, noise_multiplier=2.0)),
                        "--out", out), "privacy.dp", "not both")
    one_error_line(*cli("run", write(**_dp("laplace")), "--out", out), "privacy.dp.mechanism")
    assert not (tmp_path / "out").exists()


def test_epsilon_without_validation_is_a_clear_error() -> None:
    from fedflock.config import parse_config

    cfg = parse_config(small_config(**_dp("client", epsilon=1.0)))
    with pytest.raises(ConfigError, match="rounds is unknown"):
        ClientRuntime(build_federated_data(cfg.data, 0), cfg.model, cfg.training, 0,
                      cfg.privacy)
