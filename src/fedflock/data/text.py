"""Text corpora for next-token prediction: read documents, deal them to clients, tokenise.

Images are decoded into tensors before a scenario splits them; text cannot be, because the
tokenizer must be trained on the clients' training text only (a vocabulary built on the test
articles would leak them). So a corpus reader returns documents, the scenario deals whole
documents to clients and splits each client's documents into train and test (never a document
across both), a tokenizer (`tokenizers`, trained here, never downloaded) is fitted on every
client's training documents, and each client's token stream is cut into fixed-length
sequences: inputs `x[t]`, targets `x[t + 1]`, with an end-of-document token between documents.

The trained tokenizer is cached under `$FEDFLOCK_CACHE/tokenizers`, keyed by what it was
trained on (the level, the vocabulary size and the training text), and travels with the
run as `tokenizer.json` so new clients are tokenised as the trained ones were.
"""

from __future__ import annotations

import csv
import hashlib
import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Literal

import numpy as np
import torch

from fedflock.data.datasets import DATASETS
from fedflock.errors import ConfigError, DataError
from fedflock.fileio import atomic_open

Level = Literal["word", "char"]
UNKNOWN, END = "[UNK]", "[EOD]"
TRAIN_SHARE = 0.8  # of each client's documents, the rest its test documents


@dataclass(frozen=True)
class Corpus:
    """Documents with the topic of each (the hidden group a `topics` scenario deals by)."""

    name: str
    documents: tuple[str, ...]
    topics: np.ndarray  # (N,) int64, 0..len(topic_names) - 1
    topic_names: tuple[str, ...]
    level: Level  # the tokenizer's unit
    source: Path  # the file read (said in one line when it is read)


@DATASETS.register("agnews", "AG News articles of 4 topics, word-level next-token prediction "
                   "(ag_news/train.csv where present, else test.csv)")
@lru_cache(maxsize=2)
def read_agnews(root: Path | None) -> Corpus:
    """AG News from `ag_news/train.csv` where users have it, else `ag_news/test.csv` (the
    7,600-article split; the class, title and description columns, no header)."""
    if root is None:
        raise DataError("dataset 'agnews' needs ag_news/test.csv (or train.csv) but no data "
                        "root is set; set data.root or FEDFLOCK_DATA to the folder holding it")
    candidates = [root / "ag_news" / name for name in ("train.csv", "test.csv")]
    path = next((p for p in candidates if p.is_file()), None)
    if path is None:
        raise DataError(f"dataset 'agnews': neither {candidates[0]} nor {candidates[1]} "
                        "exists; get ag_news_csv from the AG News corpus (Zhang et al. 2015)")
    documents, topics = [], []
    try:
        with path.open(newline="", encoding="utf-8") as fh:
            for line, row in enumerate(csv.reader(fh), 1):
                if len(row) != 3 or not row[0].isdigit() or not 1 <= int(row[0]) <= 4:
                    raise DataError(f"{path}: line {line} is not 'class (1-4)', title, "
                                    "description")
                documents.append(f"{row[1]}. {row[2]}".replace("\\", " "))
                topics.append(int(row[0]) - 1)
    except (OSError, UnicodeDecodeError) as err:
        raise DataError(f"{path}: unreadable ({type(err).__name__}: {err})") from None
    if not documents:
        raise DataError(f"{path}: no article")
    return Corpus("agnews", tuple(documents), np.array(topics, dtype=np.int64),
                  ("World", "Sports", "Business", "Sci/Tech"), "word", path)


def train_tokenizer(texts: list[str], vocab_size: int, level: Level) -> str:
    """A tokenizer fitted on `texts` (its JSON), from the cache when it was fitted before."""
    digest = hashlib.sha256(f"{level}|{vocab_size}|".encode())
    for text in texts:
        digest.update(text.encode())
        digest.update(b"\0")
    root = Path(os.environ.get("FEDFLOCK_CACHE", Path.home() / ".cache" / "fedflock"))
    path = root / "tokenizers" / f"{level}-{digest.hexdigest()[:20]}.json"
    if path.is_file():
        return path.read_text()
    from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.WordLevel(unk_token=UNKNOWN))
    if level == "word":
        tokenizer.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase()])
        tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    else:  # every character one token, spaces and newlines included
        tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex("(?s)."), "isolated")
    trainer = trainers.WordLevelTrainer(vocab_size=vocab_size, special_tokens=[UNKNOWN, END])
    tokenizer.train_from_iterator(texts, trainer)
    raw = tokenizer.to_str()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_open(path, "w") as fh:
            fh.write(raw)
    except OSError:  # a read-only cache: fitted again next time
        pass
    return raw


def token_stream(tokenizer_json: str, documents: list[str]) -> np.ndarray:
    """The documents' token ids, each document followed by the end-of-document token."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_str(tokenizer_json)
    end = tokenizer.token_to_id(END)
    parts = [np.append(np.asarray(e.ids, dtype=np.int64), end)
             for e in tokenizer.encode_batch(documents)]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def vocabulary_size(tokenizer_json: str) -> int:
    from tokenizers import Tokenizer

    return Tokenizer.from_str(tokenizer_json).get_vocab_size()


def sequences(stream: np.ndarray, length: int, limit: int | None, rng: np.random.Generator
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """Non-overlapping windows of `length` + 1 tokens as (inputs, next tokens), at most
    `limit` of them, chosen at random (in stream order) when there are more."""
    count = (len(stream) - 1) // length
    if limit is not None and count > limit:
        keep = np.sort(rng.choice(count, size=limit, replace=False))
    else:
        keep = np.arange(count)
    starts = keep * length
    windows = stream[starts[:, None] + np.arange(length + 1)]
    return (torch.from_numpy(windows[:, :-1].copy()), torch.from_numpy(windows[:, 1:].copy()))


def deal_documents(corpus: Corpus, clients: int, kind: str, groups: int, seed: int
                   ) -> tuple[list[np.ndarray], np.ndarray]:
    """Each client's documents and its hidden group. `topics`: a client of group k holds
    documents of topic k only, the topic's documents dealt evenly to its clients; `iid`: every
    document dealt at random, topics mixed (one group)."""
    rng = np.random.default_rng([seed, 1])
    if kind == "iid":
        order = rng.permutation(len(corpus.documents))
        return list(np.array_split(order, clients)), np.zeros(clients, dtype=np.int64)
    if kind != "topics":
        raise ConfigError(f"config: data.scenario.kind: text dataset {corpus.name!r} takes "
                          f"'topics' or 'iid', not {kind!r}")
    if groups > len(corpus.topic_names):
        raise ConfigError(f"config: data.scenario.groups: {corpus.name} has "
                          f"{len(corpus.topic_names)} topics, not {groups}")
    group_of = rng.permutation(np.arange(clients) % groups)
    held: list[np.ndarray] = [np.zeros(0, dtype=np.int64)] * clients
    for topic in range(groups):
        members = np.flatnonzero(group_of == topic)
        rows = rng.permutation(np.flatnonzero(corpus.topics == topic))
        for client, part in zip(members, np.array_split(rows, len(members)), strict=True):
            held[client] = part
    return held, group_of.astype(np.int64)


def split_documents(rows: np.ndarray, rng: np.random.Generator
                    ) -> tuple[np.ndarray, np.ndarray]:
    """A client's documents into train and test, whole documents each side."""
    rows = rng.permutation(rows)
    cut = max(1, min(len(rows) - 1, round(TRAIN_SHARE * len(rows))))
    return rows[:cut], rows[cut:]
