"""What a model builder and an objective need to know about the data, and nothing more."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DataSpec:
    """Input shape of one sample (or sequence length for tokens), the number of classes (the
    vocabulary size for next-token data), and the objective the data are scored by."""

    input_shape: tuple[int, ...]
    num_classes: int
    objective: str = "classification"
    vocab_size: int | None = None  # token inputs: ids in 0..vocab_size-1 (integer tensors)

    @property
    def integer_inputs(self) -> bool:
        return self.vocab_size is not None

    def to_dict(self) -> dict[str, object]:
        return {"input_shape": list(self.input_shape), "num_classes": self.num_classes,
                "objective": self.objective, "vocab_size": self.vocab_size}

    @classmethod
    def from_dict(cls, raw: dict[str, object]) -> DataSpec:
        vocab = raw.get("vocab_size")
        return cls(tuple(int(s) for s in raw["input_shape"]),  # type: ignore[union-attr]
                   int(raw["num_classes"]), str(raw.get("objective", "classification")),
                   None if vocab is None else int(vocab))  # type: ignore[arg-type]
