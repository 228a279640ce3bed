"""Recipes of the fine-tuning experiments: what is trained (variants), on which data, for how long.

A `Preset` fixes the pretrained source, the window and cluster settings, the training `Stage`s and the evaluation
splits; `make_preset` names the recipes that ``bench/reproduce_longrange.py`` and ``examples/demo.py`` run.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from hf_clusterformer.centroid_updates import SMALL_MODEL_CENTROIDS, CentroidUpdateSettings

__all__ = ["MAIN_VARIANTS", "PRESETS", "Preset", "Stage", "VARIANTS", "VARIANT_LAYER_TYPE", "VARIANT_OPTIONS",
           "make_preset"]

PRETRAINED_ORIGIN = "sentence-transformers/all-MiniLM-L6-v2"

#: Variants `compare` trains: the layer type put in place of the preset's cluster layers ("sliding": none).
VARIANTS = ("clusterformer", "clusterformer-prefix", "window-cluster", "sliding", "lsh", "sparse")
#: The named recipes of `make_preset`.
PRESETS = ("smoke", "demo", "gain", "gain-gpu", "study", "study-gpu", "cpu", "gpu")
#: The layer type each variant puts at the recipe's cluster layers (None: none, a sliding-window model).
VARIANT_LAYER_TYPE = {"clusterformer": "cluster", "clusterformer-prefix": "cluster",
                      "window-cluster": "window_cluster", "sliding": None, "lsh": "lsh", "sparse": "sparse"}
#: Model options of a variant beyond its layer type (``clusterformer-prefix``: question prefix in every chunk).
VARIANT_OPTIONS = {"clusterformer-prefix": {"chunk_question_prefix": True}}
#: Variants run first on every seed (the comparison itself); the others on ``extra_variant_seeds`` seeds.
MAIN_VARIANTS = ("clusterformer", "clusterformer-prefix", "window-cluster", "sliding")




def centroid_settings(update_every_steps: int, memory_size: int) -> CentroidUpdateSettings:
    """The small models' centroid settings (`SMALL_MODEL_CENTROIDS`) refitted every ``update_every_steps`` over a bank
    of ``memory_size`` states, with the torch K-Means (the same on every machine)."""
    return replace(
        SMALL_MODEL_CENTROIDS, update_every_steps=update_every_steps, memory_size=memory_size, backend="torch"
    )


@dataclass
class Stage:
    """One training stage: its data (``kind: generator options``), steps, batch size and learning rate.

    ``gate``: end the stage at the first learning-curve point whose near twin EM reaches it (``steps`` is then the
    most it trains); ``rehearsal_batch``: questions of the first stage's data added to every step of this one;
    ``far_curve``: this stage's learning-curve points score the far questions too (False: only the near ones).
    """

    name: str
    data: dict[str, dict]
    steps: int
    batch_size: int
    learning_rate: float
    gate: float | None = None
    rehearsal_batch: int = 0
    far_curve: bool = True


@dataclass
class Preset:
    pretrained: str  # "minilm" or "tiny" (a random BERT, for the smoke test)
    window_size: int
    window_stride: int
    cluster_layers: list[int]
    num_clusters: int
    stages: list[Stage]
    eval: dict[str, dict]
    eval_samples: int
    train_samples: int
    seeds: list[int]
    variants: list[str]
    extra_variant_seeds: int = 1  # LSH / sparse run on this many seeds
    centroids: CentroidUpdateSettings = field(default_factory=lambda: centroid_settings(50, 20_000))
    max_answer_length: int = 8
    time_budget: float = 3600.0
    max_question_length: int = 16
    num_facts: int = 16
    num_hidden_layers: int | None = None  # keep the first N pretrained layers (None: all)
    frozen_layers: int = 0  # embeddings and the first N layers are not trained
    schedule: str = "linear"  # "linear": warm-up then linear decay to 0 per stage; "constant": warm-up then constant
    warmup_steps: int | None = None  # per stage (None: 5% of its steps)
    cluster_lr_scale: float = 1.0  # learning-rate factor for the parameters of the global (cluster) layers
    routed_lr_scale: float = 1.0  # learning-rate factor for the zero-started routed projection (window_cluster)
    curve_every: int = 0  # evaluate ``curve_samples`` held-out far twin questions every N steps (0: never)
    curve_samples: int = 100
    order: str = "epochs"  # "epochs": a shuffle per pass over a stage's data; "sequential": in the generated order


def _twin(lo, hi, min_gap=0, max_gap=None, **extra):
    return {"context_tokens": (lo, hi), "min_gap_tokens": min_gap, "max_gap_tokens": max_gap, **extra}


def _balanced(lo, hi, min_gap=0, max_gap=None, **extra):
    """Twin questions without a positional shortcut: facts spread evenly, one-token names, the later mention
    trained."""
    return _twin(lo, hi, min_gap, max_gap, names="words", placement="balanced", target="later", **extra)


def _chains(lo, hi, min_gap, **extra):
    return {"context_tokens": (lo, hi), "min_gap_tokens": min_gap, "max_chains": 3, **extra}


def make_preset(name: str) -> Preset:
    """The recipes. Far gaps exceed what the sliding stack relays (layers x window size): 6 x 32 = 192 (demo, cpu),
    6 x 16 = 96 (study), 6 x 64 = 384 (gpu)."""
    if name == "smoke":
        return Preset(
            pretrained="tiny", window_size=16, window_stride=12, cluster_layers=[1], num_clusters=8,
            stages=[
                Stage("near", {"twin": _twin(45, 60, 0, 6, num_facts=4), "local": _chains(45, 60, 5)}, 4, 4, 1e-3,
                      gate=90.0, far_curve=False),  # as the demo's
                Stage("far", {"twin": _twin(70, 90, 30, num_facts=4), "local": _chains(70, 90, 30)}, 4, 4, 1e-3,
                      rehearsal_batch=2),
            ],
            eval={
                "twin": _twin(70, 90, 30, num_facts=4), "longrange": _chains(70, 90, 30), "local": _chains(70, 90, 30)
            },
            eval_samples=6, train_samples=16, seeds=[0], variants=["clusterformer", "sliding", "lsh", "sparse"],
            centroids=centroid_settings(2, 2000), time_budget=120, num_facts=4, curve_every=3, curve_samples=4,
        )
    # the gated twin recipe (bench/measured/gain/): near stage to 85 near EM, far stage with rehearsal
    if name == "gain":
        near = _twin(62, 72, names="words", placement="gap", target="later", num_places=20, num_facts=5)
        far = _balanced(300, 340, 200, num_places=20)
        return Preset(
            pretrained="minilm", window_size=32, window_stride=28, cluster_layers=[3], num_clusters=64,
            stages=[Stage("near", {"twin": near}, 600, 16, 1e-4, gate=85.0),
                    Stage("far", {"twin": far}, 420, 8, 5e-5, rehearsal_batch=4)],
            eval={"twin": far}, eval_samples=150, train_samples=3000, seeds=[0, 1, 2],
            variants=["clusterformer", "sliding"], max_question_length=32, centroids=centroid_settings(50, 20_000),
            time_budget=3 * 3600, schedule="constant", warmup_steps=30, curve_every=50, curve_samples=150,
            order="sequential",
        )
    if name == "gain-gpu":  # the gain recipe's three seeds on one GPU
        preset = make_preset("gain")
        preset.time_budget = 520
        return preset
    if name == "demo":  # the gain recipe on two CPU cores: one seed, 250 far steps (150 gave +16.0 far EM, 250
        # +29.3: bench/measured/demo/), near-only curve points in the near stage
        preset = make_preset("gain")
        preset.stages[0].steps, preset.stages[1].steps = 300, 250
        preset.stages[0].far_curve = False
        preset.seeds, preset.curve_samples, preset.eval_samples, preset.time_budget = [0], 100, 150, 60 * 60
        preset.routed_lr_scale = 30.0  # a window_cluster layer's routed path opens in time (window-cluster-routed-lr)
        return preset
    if name == "study":  # the long-range study's CPU baseline: no positional shortcut, one-token names, curves
        far = {"twin": _balanced(150, 180, 100), "local": _chains(150, 180, 100)}
        return Preset(
            pretrained="minilm", window_size=16, window_stride=14, cluster_layers=[3], num_clusters=32,
            stages=[
                Stage("near", {"twin": _balanced(60, 80, 0, num_facts=12)}, 200, 4, 1e-4),
                Stage("far", far, 300, 4, 5e-5),
            ],
            eval=far, eval_samples=100, train_samples=3000, seeds=[0, 1],
            variants=["clusterformer", "clusterformer-prefix", "sliding"], frozen_layers=3,
            time_budget=3600, num_facts=20,
            schedule="constant", warmup_steps=30, curve_every=50, curve_samples=100,
        )
    if name == "study-gpu":  # the study recipe with 3 seeds and ~10x the examples, for one GPU
        preset = make_preset("study")
        preset.stages[0].steps, preset.stages[0].batch_size = 400, 16
        preset.stages[1].steps, preset.stages[1].batch_size = 800, 16
        preset.seeds, preset.eval_samples, preset.curve_every, preset.curve_samples = [0, 1, 2], 200, 100, 200
        preset.centroids, preset.time_budget = centroid_settings(100, 50_000), 500
        return preset
    if name == "cpu":
        far = {"twin": _twin(350, 450, 200), "longrange": _chains(350, 450, 200), "local": _chains(350, 450, 200)}
        return Preset(
            pretrained="minilm", window_size=32, window_stride=28, cluster_layers=[3], num_clusters=64,
            stages=[
                Stage("near", {"twin": _twin(150, 250, 0, 10), "local": _chains(60, 90, 5)}, 200, 8, 1e-4),
                Stage("far", far, 400, 8, 5e-5),
            ],
            eval=far, eval_samples=150, train_samples=3000, seeds=[0], variants=["clusterformer", "sliding"],
            time_budget=3600,
        )
    if name == "gpu":
        far = {
            "twin": _twin(1000, 2500, 400), "longrange": _chains(1000, 2500, 400), "local": _chains(1000, 2500, 400)
        }
        return Preset(
            pretrained="minilm", window_size=64, window_stride=56, cluster_layers=[3], num_clusters=128,
            stages=[
                Stage("near", {"twin": _twin(300, 500, 0, 20), "local": _chains(150, 250, 5)}, 300, 32, 1e-4),
                Stage("far", far, 800, 16, 5e-5),
            ],
            eval=far, eval_samples=200, train_samples=6000, seeds=[0, 1, 2],
            variants=["clusterformer", "sliding", "lsh", "sparse"],
            centroids=centroid_settings(100, 50_000), time_budget=460,
        )
    raise ValueError(f"unknown preset {name!r}; choose {', '.join(PRESETS)}.")

