"""Published tables, regenerated instead of copied: each is declared here (configs, algorithms,
seeds), run by one command into a results file under version control, and rendered from that
file into its documentation page, never typed.

    python -m benchmarks.reproduce list                  # the tables, their pages and rows
    python -m benchmarks.reproduce run NAME [--quick]    # its rows (a run already there is kept)
    python -m benchmarks.reproduce render [--check]      # every page's tables from the rows

`--quick` runs the table's quick experiments for a few rounds on one seed into `runs/reproduce`
(not the committed rows): minutes, to prove the pipeline end to end. `render --check` (run by
`make docs` and `make test`) fails naming the page whose table differs from its rendering.
A table shows, per config and algorithm, final-round accuracy and the best accuracy over the
evaluated rounds (what peers often report; the difference is information), each as mean ± std
over seeds, the worst client and the clusters and ARI of each seed.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from benchmarks.tables import (
    ROOT,
    STANDARD,
    BesidePaper,
    ConfigTable,
    Experiment,
    GridFigure,
    GridTable,
    Headline,
    HeadlineTable,
    Reported,
    SweepTable,
    TimingTable,
    View,
    at_scale,
    course_table,
    first_split_cell,
    grid_found,
    read_rows,
    versus,
)

RESULTS = ROOT / "benchmarks" / "results" / "tables"
DOCS = ROOT / "docs"

POISONING = ("incremental", "fedavg", "median", "trimmed_mean", "krum", "multi_krum")
ROBUST = ("fedavg", "median", "trimmed_mean", "krum", "irls", "credit", "gra")
ATTACKED = ("benign", "benign_best", "asr", "clusters")
MODEL_POISONED = ("benign", "benign_best", "clusters")  # no attack success rate to measure
SPLIT_SETTINGS = [f"algorithm.{name}={value}" for name, values in (
    ("f_threshold", (2.0, 2.5, 3.5, 5.0, 8.0)), ("patience", (1, 2, 3, 5)),
    ("warmup_rounds", (0, 5, 10, 20))) for value in values]
MNIST5K = ("data.dataset=mnist5k", "data.samples_per_client=200", "data.test_per_client=50")
SPLIT_SCENARIOS = {
    "mnist5k label_permutation K=4": (*MNIST5K, "data.scenario={kind: label_permutation, "
                                      "groups: 4}"),
    "mnist5k rotation K=4": (*MNIST5K, "data.scenario={kind: rotation, groups: 4}"),
    "digits label_swap K=2": ("data.scenario={kind: label_swap, groups: 2}",),
    "mnist5k iid": MNIST5K,
    "digits iid": (),
}
DISTFL_BASELINES = ("distfl", "fedavg", "local", "fedavg_ft")  # fedavg_ft: the paper's LG-Net
HAR = ("rounds=20", "algorithm={name: distfl, warmup_rounds: 5}")
FLIP_RULES = ("fedavg", "median", "krum", "gra", "credit", "irls")
PROBES = [(f"{kind}, {inputs}, {rule}", (f"data.scenario={{kind: {kind}, groups: 2}}",
                                         f"algorithm.steps={steps}",
                                         f"algorithm.threshold={threshold}"))
          for kind in ("feature_skew", "label_permutation", "rotation", "iid")
          for inputs, steps in (("synthesised", 200), ("noise", 0))
          for rule, threshold in (("k nearest", "null"), ("threshold 0.2", 0.2))]
DP_COLUMNS = ("final", "best", "clusters", "ari", "sigma", "epsilon")
DP_DIGITS = [("no DP", "privacy.dp=null"), *(
    (f"{mechanism}, ε = {epsilon}", f"privacy.dp={{mechanism: {mechanism}, "
     f"epsilon: {epsilon}, clip: {clip}}}")
    for mechanism, clip, epsilons in (("client", 0.5, (300, 30, 8, 1)), ("dp-sgd", 1.0, (8, 1)))
    for epsilon in epsilons)]
RULES = [(f"{kind}, {rule}", ("rounds=5", f"data.scenario={{kind: {kind}, groups: {groups}}}",
                               f"algorithm.threshold={threshold}"))
         for kind, groups in (("iid", 1), ("category_imbalance", 5), ("label_permutation", 4),
                              ("feature_skew", 4))
         for rule, threshold in (("k nearest", "null"), ("threshold 0.2", 0.2))]
IFCA_SCENARIOS = ("label_permutation", "rotation")
IFCA_ROUNDS = ("rounds=30", "checkpoint_every=30")
ATTACK_FREE = [("no-attack", "attack=null")]


SHAPE_REFERENCES = ("fedavg", "local", "fedavg_ft", "cfl")
GIVEN_K = ("fedsoft", "fedrc", "fedem")
SHAPE_COLUMNS = (*STANDARD, "alternative", "traffic")


def federation_shape(config: str, shift: str, data: tuple[str, ...] = (),
                     groups: bool = False) -> tuple[Experiment, ...]:
    """Every baseline at FedDAG's federation shape on one shift: the references, PACFL and
    FedDAG (also with its dual encoder) with their defaults, IFCA (both initialisations) and
    the soft methods given K = 4; where there are groups, the per-group oracle and 10 new
    clients joining PACFL's and FedDAG's trained runs."""
    return (Experiment(config, SHAPE_REFERENCES + (("oracle",) if groups else ()),
                       overrides=data, label=shift),
            Experiment(config, ("pacfl", "feddag"), overrides=data, label=shift,
                       newcomers=10 if groups else 0),
            Experiment(config, ("feddag",), label=f"{shift}, dual encoder",
                       overrides=(*data, "model.dual_encoder=true")),
            *(Experiment(config, ("ifca",), label=f"{shift}, K=4, {init}", overrides=(
                *data, f"algorithm={{name: ifca, clusters: 4, init: {init}}}"))
              for init in ("random", "clients")),
            *(Experiment(config, (name,), label=f"{shift}, K=4", overrides=(
                *data, f"algorithm={{name: {name}, clusters: 4}}")) for name in GIVEN_K))


SMALL_MNIST = ("data.samples_per_client=200",)  # the weight-space methods' papers' size
TEXT_COLUMNS = ("perplexity", "perplexity_best", "perplexity_worst", "next_token_accuracy",
                "clusters", "ari")
TOPICS = "agnews, 4 topics"
# Seconds per round, one seed, 3 rounds of FedAvg: each dataset with each model at its table's
# scale (the Transformer as wide as the LSTM, 2 heads).
TEXT_MODELS = (("lstm_lm", ()), ("transformer_lm", ("model.name=transformer_lm",
                                                    "model.heads=2")))


def fractions(kind: str, shares: tuple[float, ...]) -> list[tuple[str, str]]:
    return [(f"{kind}-{share:.0%}", f"attack.fraction={share}") for share in shares]


def category(config: str, ks: tuple[int, ...], noise: bool) -> tuple[Experiment, ...]:
    """DistFL against its paper's baselines on a category-imbalance config: K-Cluster is IFCA
    at the given K; `noise` adds DistFL probed with plain noise (what the authors' code uses)."""
    stem = config.removesuffix(".yaml")
    return (Experiment(config, DISTFL_BASELINES),
            *((Experiment(config, ("distfl",), overrides=("algorithm.steps=0",),
                          label=f"{stem}, noise inputs"),) if noise else ()),
            *(Experiment(config, ("ifca",), label=f"{stem}, K={k}",
                         overrides=(f"algorithm={{name: ifca, clusters: {k}}}",)) for k in ks))


TABLES: dict[str, ConfigTable | GridTable | TimingTable | View] = {t.name: t for t in [
    ConfigTable("four-groups-mnist", "results/index.md", (
        Experiment("mnist_label_permutation.yaml",
                   ("cfl", "fedavg", "oracle", "fedavg_ft", "local")),
        Experiment("mnist_rotation.yaml", ("cfl", "fedavg", "oracle")),
        Experiment("mnist_iid.yaml", ("cfl", "fedavg")),
    )),
    ConfigTable("four-groups-digits", "results/index.md", (
        Experiment("digits_label_permutation.yaml", ("cfl", "fedavg", "oracle"), quick=True),
        Experiment("digits_rotation.yaml", ("cfl", "fedavg", "oracle"), quick=True),
        Experiment("digits_iid.yaml", ("cfl", "fedavg"), quick=True),
    )),
    SweepTable("split-rule-sensitivity", "results/index.md", tuple(
        Experiment("digits_iid.yaml", ("cfl",), overrides=(setting, "rounds=40", *data),
                   label=f"{setting} · {scenario}")
        for setting in SPLIT_SETTINGS for scenario, data in SPLIT_SCENARIOS.items()),
        seeds=(0, 1), defaults=("algorithm.f_threshold=3.5", "algorithm.patience=3",
                             "algorithm.warmup_rounds=10")),
    SweepTable("first-split", "results/index.md", tuple(
        Experiment("mnist_label_swap.yaml", ("cfl",), overrides=(setting,),
                   label=f"{setting} · mnist label_swap K=2")
        for setting in (f"data.samples_per_client={n}" for n in (5, 10, 15, 20, 30, 50, 100, 200))),
        cell=first_split_cell, legend="Seeds whose first split cut the true groups (its round), "
        "of seeds"),
    ConfigTable("partial-10pct", "results/partial-participation.md", (
        Experiment("mnist_partial_label_permutation.yaml",
                   ("incremental", "cfl", "fedavg", "oracle")),
    ), columns=(*STANDARD, "traffic"), threads=1),
    ConfigTable("partial-1pct", "results/partial-participation.md", (
        Experiment("mnist_partial_1pct.yaml", ("incremental", "cfl", "fedavg")),
    ), columns=(*STANDARD, "traffic"), appendix=course_table("incremental", {
        "ARI, all clients": "ari", "ARI among placed clients": "ari_placed",
        "clients waiting": "unplaced"})),
    ConfigTable("sign-flip", "results/poisoning.md", tuple(
        Experiment("mnist_attack_sign_flip.yaml", POISONING, overrides=(setting,), label=label)
        for label, setting in ATTACK_FREE + fractions("sign-flip", (0.2, 0.4, 0.6))),
        columns=MODEL_POISONED),
    ConfigTable("sign-flip-independent", "results/poisoning.md", (
        Experiment("mnist_attack_sign_flip.yaml", ("incremental", "fedavg", "median", "krum"),
                   overrides=("attack.colluding=false",), label="sign-flip-independent-60%"),
    ), columns=MODEL_POISONED),
    ConfigTable("model-poisoning-kinds", "results/poisoning.md", tuple(
        Experiment("mnist_attack_sign_flip.yaml", ("incremental", "fedavg", "median", "krum"),
                   overrides=("attack.fraction=0.4", "attack.colluding=false",
                              f"attack.kind={kind}"), label=f"{kind}-40%")
        for kind in ("random", "zero", "model_replacement")), seeds=(0,), columns=ATTACKED),
    ConfigTable("label-flip", "results/poisoning.md", tuple(
        Experiment("mnist_attack_label_flip.yaml", POISONING, overrides=(setting,), label=label)
        for label, setting in fractions("label-flip", (0.4, 0.6))), columns=ATTACKED),
    ConfigTable("robust-label-flip", "results/poisoning.md", tuple(
        Experiment("mnist_attack_label_flip.yaml", ROBUST, overrides=(setting,), label=label)
        for label, setting in ATTACK_FREE + fractions("label-flip", (0.1, 0.3, 0.4))),
        columns=ATTACKED),
    ConfigTable("scale", "results/scale.md", (
        Experiment("mnist_scale_10k.yaml", ("incremental",), label="10,000 clients, exact"),
        Experiment("mnist_scale_10k.yaml", ("incremental",), overrides=("algorithm.sketch=4096",),
                   label="10,000 clients, sketched"),
        Experiment("mnist_scale_100k.yaml", ("incremental",), label="100,000 clients"),
    ), seeds=(0,), columns=("final", "clusters", "ari", "clustered", "seconds", "peak_rss"),
        isolated=True, threads=1),
    ConfigTable("ifca", "results/ifca.md", (
        *(Experiment(f"mnist_{scenario}.yaml", ("fedavg",), overrides=IFCA_ROUNDS,
                     label=f"{scenario}, fedavg") for scenario in IFCA_SCENARIOS),
        *(Experiment(f"mnist_{scenario}.yaml", ("ifca",), label=f"{scenario}, K={k}, {init}",
                     overrides=(*IFCA_ROUNDS, f"algorithm={{name: ifca, clusters: {k}, "
                                f"init: {init}}}"))
          for scenario in IFCA_SCENARIOS for init in ("random", "clients")
          for k in ((2, 3, 4) if scenario == "label_permutation" else (4,))),
    )),
    ConfigTable("distfl-har", "results/distfl.md", (
        Experiment("har_users.yaml", DISTFL_BASELINES, overrides=HAR),
        *(Experiment("har_users.yaml", ("ifca",), label=f"har_users, K={k}",
                     overrides=(*HAR, f"algorithm={{name: ifca, clusters: {k}}}"))
          for k in (2, 3)),
    ), threads=1),
    *(ConfigTable(f"shape-{dataset}-concept", "results/federation-shape.md", federation_shape(
        f"{dataset}_100_clients_20pct.yaml", "concept shift", groups=True),
        columns=(*SHAPE_COLUMNS, "newcomers"), threads=1) for dataset in ("mnist", "cifar10")),
    *(ConfigTable(f"shape-{dataset}-label-skew", "results/federation-shape.md",
                  federation_shape(f"{dataset}_100_clients_20pct.yaml", "label skew",
                                   ("data.scenario={kind: dirichlet, alpha: 0.5}",)),
                  columns=SHAPE_COLUMNS, threads=1) for dataset in ("mnist", "cifar10")),
    ConfigTable("shape-mnist-iid", "results/federation-shape.md", (
        Experiment("mnist_100_clients_20pct.yaml", ("pacfl", "feddag", "fedavg"),
                   overrides=("data.scenario={kind: iid, groups: 1}",), label="IID"),),
        columns=SHAPE_COLUMNS, threads=1),
    ConfigTable("feddag-automatic-k", "methods/feddag.md", tuple(
        Experiment("mnist_100_clients_20pct.yaml", ("feddag",), label=label,
                   overrides=(f"data.scenario={{kind: {scenario}}}", "rounds=3", "eval_every=3"))
        for label, scenario in (
            ("2 groups", "label_permutation, groups: 2"),
            ("4 groups", "label_permutation, groups: 4"),
            ("8 groups", "label_permutation, groups: 8"),
            ("IID", "iid, groups: 1"), ("label skew, Dirichlet 0.5", "dirichlet, alpha: 0.5"))),
        seeds=tuple(range(8)), columns=("clusters", "ari"), threads=1),
    ConfigTable("pacfl-angle", "methods/pacfl.md", tuple(
        Experiment("mnist_100_clients_20pct.yaml", ("pacfl",), label=f"{label}, {angle}",
                   overrides=(f"data.scenario={{kind: {scenario}}}", f"algorithm.angle={angle}",
                              "rounds=1", "eval_every=1"))
        for label, scenario in (("4 groups", "label_permutation, groups: 4"),
                                ("IID", "iid, groups: 1"),
                                ("label skew, Dirichlet 0.5", "dirichlet, alpha: 0.5"))
        for angle in ("principal", "elementwise")), columns=("clusters", "ari"), threads=1),
    ConfigTable("feddag-ablations", "methods/feddag.md", tuple(
        Experiment("mnist_100_clients_20pct.yaml", ("feddag",), label=label, overrides=(
            "data.scenario={kind: dirichlet, alpha: 0.5}", *settings))
        for label, settings in (
            ("fused, random mask, single encoder", ()),
            ("data similarity only", ("algorithm.similarity=data",)),
            ("gradient similarity only", ("algorithm.similarity=gradient",)),
            ("top-k instead of a random mask", ("algorithm.sparsify=topk",)),
            ("dual encoder", ("model.dual_encoder=true",)))),
        columns=(*SHAPE_COLUMNS[:5], "traffic"), threads=1),
    ConfigTable("fedper-digits", "methods/fedper.md", (
        Experiment("digits_label_permutation.yaml",
                   ("fedper", "fedbabu", "fedavg", "fedavg_ft", "local")),
        Experiment("digits_iid.yaml", ("fedper", "fedbabu", "fedavg", "local")),
    ), columns=(*STANDARD, "traffic"), threads=1),
    ConfigTable("distfl-category-mnist", "results/distfl.md",
                category("mnist_category_imbalance.yaml", (3, 5, 7), noise=True),
                columns=(*STANDARD, "seconds"), threads=1),
    ConfigTable("distfl-category-cifar10", "results/distfl.md",
                category("cifar10_category_imbalance.yaml", (5, 3), noise=False),
                columns=(*STANDARD, "seconds"), threads=1),
    ConfigTable("distfl-probe", "results/distfl.md", tuple(
        Experiment("digits_distfl_probe.yaml", ("distfl",), overrides=overrides, label=label)
        for label, overrides in PROBES), columns=("clusters", "ari"), threads=1),
    ConfigTable("distfl-rules", "results/distfl.md", tuple(
        Experiment("mnist_category_imbalance.yaml", ("distfl",), overrides=overrides,
                   label=label) for label, overrides in RULES), seeds=(0, 1, 2, 3),
        columns=("clusters", "ari"), threads=1),
    ConfigTable("distfl-label-flip", "results/distfl.md", tuple(
        Experiment("mnist_label_flip_distfl.yaml", ("distfl",), overrides=(setting,),
                   label=label)
        for label, setting in ATTACK_FREE + fractions("label-flip", (0.1, 0.4, 0.8))),
        columns=ATTACKED, threads=1),
    ConfigTable("distfl-label-flip-rules", "results/distfl.md", tuple(
        Experiment("mnist_label_flip_distfl.yaml", FLIP_RULES, overrides=(setting,),
                   label=label)
        for label, setting in ATTACK_FREE + fractions("label-flip", (0.1, 0.4, 0.8))),
        columns=ATTACKED, threads=1),
    TimingTable("distfl-synthesis-cost", "results/distfl.md", "distfl_synthesis_cost", (
        ("model", "`{model}`"), ("dataset", "{dataset}"), ("parameters", "{parameters:,}"),
        ("z", "{z}"), ("E", "{importance:.0%}"), ("synthesis s", "{synthesis_seconds:.1f}"),
        ("loss fell", "{loss_drop:.0f}×"), ("responses of 50 models s", "{responses_seconds:.1f}"),
    ), args=("--models", "cnn_bn:mnist,cnn_bn:cifar10,cnn1d_bn:har,vgg11_bn:cifar10,"
             "resnet18:cifar10", "--z", "50,200", "--importance", "0.5,1.0")),
    TimingTable("executors", "executors.md", "executors", (
        ("clients", "{clients}"), ("sequential s/round", "{sequential_seconds:.3f}"),
        ("batched s/round", "{batched_seconds:.3f}"),
        ("processes s/round", "{processes_seconds:.3f}"), ("fastest", "{fastest}"),
        ("auto picks", "{auto}"), ("outside training (seq / batched / processes)",
                                   "{sequential_outside:.1f}% / {batched_outside:.1f}% / "
                                   "{processes_outside:.1f}%"))),
    TimingTable("flower-vs-embedded", "deploying.md", "flower_vs_embedded", (
        ("clients", "{clients}"), ("embedded s/round", "{embedded_seconds:.3f}"),
        ("fedflock on Flower s/round", "{flower_seconds:.3f}"),
        ("Flower's FedAvg s/round", "{fedavg_seconds:.3f}"),
        ("embedded faster by", "{embedded_faster:.1f}×"),
        ("fedflock on Flower vs Flower's FedAvg", "{flower_vs_fedavg:+.0f}%"),
        ("end-to-end embedded / on Flower", "{embedded_e2e:.1f} s / {flower_e2e:.1f} s"),
        ("final accuracy embedded / on Flower", "{embedded_accuracy:.3f} / {flower_accuracy:.3f}"),
    ), args=("--clients", "20,100", "--rounds", "10")),
    ConfigTable("dp-digits", "privacy.md", tuple(
        Experiment("digits_label_permutation.yaml", ("fedavg", "cfl"),
                   overrides=("rounds=50", setting), label=label)
        for label, setting in DP_DIGITS), columns=DP_COLUMNS),
    ConfigTable("dp-distfl", "privacy.md", tuple(
        Experiment("mnist_category_imbalance.yaml", DISTFL_BASELINES, label=f"client, ε = {e}",
                   overrides=(f"privacy.dp={{mechanism: client, epsilon: {e}, clip: 1.0}}",))
        for e in (30, 8, 1)), columns=DP_COLUMNS, threads=1),
    GridTable("scenario-grid", "results/scenario-grid.md"),
    ConfigTable("weight-space-mnist", "results/weight-space.md", (
        Experiment("mnist_label_permutation.yaml", ("fedavg", "oracle", "cfl", "flhc"),
                   overrides=SMALL_MNIST, label="4 groups"),
        Experiment("mnist_label_permutation.yaml", ("flhc",), label="4 groups, K=4",
                   overrides=(*SMALL_MNIST, "algorithm={name: flhc, clusters: 4}")),
        *(Experiment("mnist_label_permutation.yaml", ("ifca",), label=f"4 groups, K=4, {init}",
                     overrides=(*SMALL_MNIST, f"algorithm={{name: ifca, clusters: 4, "
                                f"init: {init}}}")) for init in ("random", "clients")),
    ), columns=(*STANDARD, "round_seconds", "traffic"), threads=1),
    ConfigTable("weight-space-iid", "results/weight-space.md", (
        Experiment("mnist_iid.yaml", ("fedavg", "flhc"), overrides=SMALL_MNIST, label="IID"),
    ), columns=STANDARD, threads=1),
    ConfigTable("text-agnews", "results/text.md", (
        Experiment("agnews_topics.yaml", ("fedavg", "cfl", "oracle", "incremental"),
                   label=TOPICS),
        *(Experiment("agnews_topics.yaml", ("ifca",), label=f"{TOPICS}, K=4, {init}",
                     overrides=(f"algorithm={{name: ifca, clusters: 4, init: {init}}}",))
          for init in ("random", "clients")),
    ), columns=TEXT_COLUMNS, against=((TOPICS, "fedavg"), (TOPICS, "oracle")), threads=1),
    ConfigTable("text-agnews-iid", "results/text.md", (
        Experiment("agnews_topics.yaml", ("fedavg", "cfl"), label="agnews, IID",
                   overrides=("data.scenario={kind: iid, groups: 1}",)),
    ), columns=TEXT_COLUMNS[:5], threads=1),
    ConfigTable("text-shakespeare", "results/text.md", (
        Experiment("shakespeare_roles.yaml",
                   ("fedavg", "fedavg_ft", "local", "cfl", "incremental")),
    ), columns=(*TEXT_COLUMNS, "nmi"), threads=1),
    ConfigTable("text-seconds", "results/text.md", tuple(
        Experiment(config, ("fedavg",), label=f"{config.removesuffix('.yaml')}, {model}",
                   overrides=("rounds=3", "eval_every=3", *settings))
        for config in ("agnews_topics.yaml", "shakespeare_roles.yaml")
        for model, settings in TEXT_MODELS),
        seeds=(0,), columns=("round_seconds", "outside_training", "perplexity"), threads=1),
]}
R = "docs/results/"
TABLES["grid-figure"] = GridFigure("grid-figure", "../README.md", "assets/scenario-grid.png",
                                   "docs/assets/scenario-grid.png")
# FedDAG's paper, its table at 100 clients and 20% per round (200 rounds): quoted figures.
# Fashion-MNIST images are not on this machine, so MNIST stands beside its FMNIST column; its
# label skew is Dir(1.0), ours Dir(0.5) (the federation-shape tables' setting).
FEDDAG_PAPER = (
    Reported("FMNIST, concept shift", "MNIST, concept shift", "shape-mnist-concept",
             "concept shift", {"FedAvg": 42.68, "PACFL": 78.42, "CFL": 82.73, "IFCA": 84.67,
                               "FedSoft": 75.89, "FedRC": 79.87, "FedDAG": 88.93}),
    Reported("CIFAR-10, concept shift", "CIFAR-10, concept shift", "shape-cifar10-concept",
             "concept shift", {"FedAvg": 42.87, "PACFL": 59.82, "CFL": 61.48, "IFCA": 64.58,
                               "FedSoft": 64.34, "FedRC": 65.48, "FedDAG": 69.90}),
    Reported("CIFAR-10, label skew Dir(1.0)", "CIFAR-10, label skew Dir(0.5)",
             "shape-cifar10-label-skew", "label skew",
             {"PACFL": 90.45, "CFL": 72.80, "IFCA": 89.68, "FedDAG": 94.53}),
    Reported("MNIST, label skew (not in the paper)", "MNIST, label skew Dir(0.5)",
             "shape-mnist-label-skew", "label skew", {}),
)
TABLES["feddag-paper"] = BesidePaper("feddag-paper", "results/federation-shape.md", (
    ("FedAvg", "fedavg", ""), ("PACFL", "pacfl", ""), ("CFL", "cfl", ""),
    ("IFCA", "ifca", ", K=4, random"), ("FedSoft", "fedsoft", ", K=4"),
    ("FedRC", "fedrc", ", K=4"), ("FedEM", "fedem", ", K=4"),
    ("FedDAG, single encoder", "feddag", ""), ("FedDAG", "feddag", ", dual encoder"),
), FEDDAG_PAPER)
TABLES["headline"] = HeadlineTable("headline", "../README.md", (
    Headline("20 clients, 4 hidden label-permutation groups, MNIST", f"{R}index.md", "Results",
             versus("four-groups-mnist", ("mnist_label_permutation", "cfl"),
                    ("mnist_label_permutation", "fedavg"))),
    Headline("the same clients with IID data (a split is not wanted)", f"{R}index.md",
             "Results", versus("four-groups-mnist", ("mnist_iid", "cfl"),
                               ("mnist_iid", "fedavg"))),
    Headline("100 clients, 4 groups, 1 client sampled per round", f"{R}partial-participation.md",
             "Partial participation", versus("partial-1pct", ("mnist_partial_1pct", "incremental"),
                                             ("mnist_partial_1pct", "cfl"))),
    Headline("66 settings drawn over datasets, scenarios, groups, clients and participation",
             f"{R}scenario-grid.md", "Scenario grid",
             grid_found("scenario-grid", "incremental", (1, 2, 3))),
    Headline("60% colluding sign-flip attackers, 100 clients", f"{R}poisoning.md", "Poisoning",
             versus("sign-flip", ("sign-flip-60%", "incremental"), ("sign-flip-60%", "median"),
                    field="benign", what="benign clients: ")),
    Headline("40% label-flipping clients, IID MNIST: the robust rules", f"{R}poisoning.md",
             "Poisoning", versus("robust-label-flip", ("label-flip-40%", "credit"),
                                 ("label-flip-40%", "median"), field="benign",
                                 what="benign clients: ")),
    Headline("10,000 clients, 1% per round", f"{R}scale.md", "Scale",
             at_scale("scale", "10,000 clients, exact", "incremental")),
    Headline("IFCA, 4 groups: the paper's random models against client-seeded ones",
             f"{R}ifca.md", "IFCA",
             versus("ifca", ("label_permutation, K=4, random", "ifca"),
                    ("label_permutation, K=4, clients", "ifca"),
                    names=("random", "client-seeded"))),
))


def _block(name: str) -> re.Pattern[str]:
    return re.compile(rf"(<!-- reproduce: {re.escape(name)} -->\n)(.*?)(<!-- /reproduce -->)",
                      re.S)


def render(results: Path, docs: Path, check: bool) -> list[str]:
    """Write (or, with `check`, compare) every table into its page and every figure into its
    image; the pages and images that differ."""
    stale = []
    for table in TABLES.values():
        page = docs / table.page
        text = page.read_text()
        pattern = _block(table.name)
        if not pattern.search(text):
            raise SystemExit(f"{page}: no '<!-- reproduce: {table.name} -->' block")
        rendered = table.render(results)
        new = pattern.sub(lambda m, body=rendered: m.group(1) + body + m.group(3), text)
        if new != text:
            stale.append(f"{table.page}: table '{table.name}' differs from its rendering")
            if not check:
                page.write_text(new)
        if isinstance(table, GridFigure):
            image, drawn = docs / table.image, table.draw(results)
            if not image.is_file() or image.read_bytes() != drawn:
                stale.append(f"{table.image}: figure '{table.name}' differs from its drawing")
                if not check:
                    image.parent.mkdir(parents=True, exist_ok=True)
                    image.write_bytes(drawn)
    return stale


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list")
    runs = sub.add_parser("run")
    runs.add_argument("name", choices=sorted(TABLES))
    runs.add_argument("--quick", action="store_true")
    runs.add_argument("--results", type=Path, default=None,
                      help="where the rows go (default: the committed ones; --quick: "
                      "runs/reproduce/results)")
    runs.add_argument("--out", type=Path, default=Path("runs/reproduce"))
    runs.add_argument("--jobs", type=int, default=1, help="runs at a time, each in a fresh "
                      "process (a table's wall seconds then share the machine)")
    renders = sub.add_parser("render")
    renders.add_argument("--check", action="store_true")
    renders.add_argument("--results", type=Path, default=RESULTS)
    renders.add_argument("--docs", type=Path, default=DOCS)
    args = parser.parse_args()
    if args.command == "list":
        for table in TABLES.values():
            rows = sum(len(read_rows(path)) for path in table.rows_files(RESULTS))
            print(f"{table.name}: docs/{table.page}, {len(table.runs(False))} runs "
                  f"({len(table.runs(True))} quick), {rows} rows committed")
    elif args.command == "run":
        results = args.results or (args.out / "results" if args.quick else RESULTS)
        print(TABLES[args.name].run(args.quick, results, args.out, args.jobs))
    else:
        stale = render(args.results, args.docs, args.check)
        for line in stale:
            print(f"{line}{'; run python -m benchmarks.reproduce render' if args.check else ''}",
                  file=sys.stderr if args.check else sys.stdout)
        if args.check and stale:
            raise SystemExit(1)


if __name__ == "__main__":
    main()
