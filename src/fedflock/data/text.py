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
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import numpy as np
import torch

from fedflock.data.datasets import DATASETS
from fedflock.errors import ConfigError, DataError
from fedflock.fileio import atomic_open

if TYPE_CHECKING:  # imported when a text federation is built, not with the package
    from tokenizers import Tokenizer

Level = Literal["word", "char"]
UNKNOWN, END = "[UNK]", "[EOD]"
TRAIN_SHARE = 0.8  # of each client's documents, the rest its test documents


@dataclass(frozen=True)
class Corpus:
    """Documents with the topic of each (the hidden group a `topics` scenario deals by) and,
    where they have one, their writer (a `natural` scenario's client: a Shakespeare role)."""

    name: str
    documents: tuple[str, ...]
    topics: np.ndarray  # (N,) int64, 0..len(topic_names) - 1
    topic_names: tuple[str, ...]
    level: Level  # the tokenizer's unit
    writers: np.ndarray | None = None  # (N,) int64: who wrote (spoke) each document
    coarse: np.ndarray | None = None  # (len(topic_names),) a coarser group of each topic
    source: str = ""  # one line: which file(s) it was read from (summary.json's data_source)


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
                  ("World", "Sports", "Business", "Sci/Tech"), "word",
                  source=f"ag_news/{path.name}: {len(documents):,} articles")


# The First Folio's three kinds (1623). Pericles is not in the Folio: a late romance, counted
# with the comedies as the other romances (The Tempest, The Winter's Tale) are there.
GENRES = ("comedy", "history", "tragedy")
FOLIO = {
    "comedy": ("alls_well_that_ends_well", "as_you_like_it", "comedy_of_errors",
               "loves_labours_lost", "measure_for_measure", "merchant_of_venice",
               "merry_wives_of_windsor", "midsummer_nights_dream", "much_ado_about_nothing",
               "taming_of_the_shrew", "tempest", "twelfth_night", "two_gentlemen_of_verona",
               "winters_tale", "pericles"),
    "history": ("henry_iv_part_1", "henry_iv_part_2", "henry_v", "henry_vi_part_1",
                "henry_vi_part_2", "henry_vi_part_3", "henry_viii", "john", "richard_ii",
                "richard_iii"),
    "tragedy": ("antony_and_cleopatra", "coriolanus", "cymbeline", "hamlet", "julius_caesar",
                "lear", "macbeth", "othello", "romeo_and_juliet", "timon_of_athens",
                "tragedy_of_titus_andronicus", "troilus_and_cressida"),
}
# A speech: a paragraph whose first line names its speaker, "Ham." or "LEONATO." or "THESEUS".
_SPEAKER = re.compile(r"^(?:[A-Z][A-Za-z'\- ]{0,30}\.|[A-Z][A-Z'\- ]{1,30}\.?)$")
_DIRECTION = re.compile(r"\[[^\]]*\]")


def _speeches(text: str) -> list[tuple[str, str]]:
    """(speaker, speech) of each speech in a play's text, stage directions removed."""
    out = []
    for paragraph in re.split(r"\n\s*\n", text.replace("\r\n", "\n")):
        lines = paragraph.strip("\n").split("\n")
        if len(lines) < 2 or not _SPEAKER.match(lines[0].strip()):
            continue
        speech = _DIRECTION.sub("", "\n".join(line.strip() for line in lines[1:])).strip()
        if speech:
            out.append((lines[0].strip().rstrip(".").upper(), speech))
    return out


@DATASETS.register("shakespeare", "Shakespeare's plays, one client per speaking role, "
                   "character-level next-character prediction (hidden group: the play)")
@lru_cache(maxsize=2)
def read_shakespeare(root: Path | None) -> Corpus:
    """The plays of `shakespeare/open_shakespeare_gutenberg/*_gut.txt` (Project Gutenberg
    texts): every speech a document, its role (play and speaker) its writer, its play its
    topic, the play's Folio kind its coarse group. Poems, which have no speakers, are left
    out."""
    folder = (root / "shakespeare" / "open_shakespeare_gutenberg") if root else None
    if folder is None or not folder.is_dir():
        raise DataError(f"dataset 'shakespeare' needs the folder "
                        f"{folder or 'shakespeare/open_shakespeare_gutenberg'} of *_gut.txt "
                        "plays; set data.root or FEDFLOCK_DATA to the folder holding it")
    kind_of = {play: GENRES.index(kind) for kind, plays in FOLIO.items() for play in plays}
    documents, topics, writers, plays, coarse = [], [], [], [], []
    roles: dict[tuple[int, str], int] = {}
    for path in sorted(folder.glob("*_gut.txt")):
        play = path.name.removesuffix("_gut.txt")
        try:
            speeches = _speeches(path.read_text(encoding="utf-8", errors="replace"))
        except OSError as err:
            raise DataError(f"{path}: unreadable ({err.strerror})") from None
        if not speeches or play not in kind_of:
            continue  # a poem
        index = len(plays)
        plays.append(play)
        coarse.append(kind_of[play])
        for speaker, speech in speeches:
            documents.append(speech)
            topics.append(index)
            writers.append(roles.setdefault((index, speaker), len(roles)))
    if not documents:
        raise DataError(f"{folder}: no play with speeches (*_gut.txt)")
    return Corpus("shakespeare", tuple(documents), np.array(topics, dtype=np.int64),
                  tuple(plays), "char", np.array(writers, dtype=np.int64),
                  np.array(coarse, dtype=np.int64),
                  source=f"shakespeare/open_shakespeare_gutenberg: {len(plays)} plays, "
                  f"{len(documents):,} speeches")


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
        tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), "isolated")
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


def load_tokenizer(tokenizer_json: str) -> Tokenizer:
    from tokenizers import Tokenizer

    return Tokenizer.from_str(tokenizer_json)


def token_stream(tokenizer: Tokenizer, documents: list[str]) -> np.ndarray:
    """The documents' token ids, each document followed by the end-of-document token."""
    end = tokenizer.token_to_id(END)
    parts = [np.append(np.asarray(e.ids, dtype=np.int64), end)
             for e in tokenizer.encode_batch(documents)]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


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


def _roles(corpus: Corpus, clients: int, coarse: bool) -> tuple[list[np.ndarray], np.ndarray]:
    """The `clients` writers who wrote the most characters, each with all its documents; the
    hidden group is the writer's topic, or its topic's coarse group."""
    if corpus.writers is None:
        raise ConfigError(f"config: data.scenario.kind: 'natural' needs documents with "
                          f"writers; {corpus.name} has none (use 'topics' or 'iid')")
    lengths = np.bincount(corpus.writers, weights=[len(d) for d in corpus.documents])
    if clients > len(lengths):
        raise ConfigError(f"config: data.clients: {corpus.name} has {len(lengths)} writers, "
                          f"not {clients}")
    chosen = np.argsort(-lengths, kind="stable")[:clients]
    held = [np.flatnonzero(corpus.writers == w) for w in chosen]
    topic = np.array([corpus.topics[rows[0]] for rows in held], dtype=np.int64)
    if coarse:
        if corpus.coarse is None:
            raise ConfigError(f"config: data.text.group_by: {corpus.name} has no coarse group")
        topic = corpus.coarse[topic]
    _, groups = np.unique(topic, return_inverse=True)  # numbered 0.. among the chosen
    return held, groups.astype(np.int64)


def deal_documents(corpus: Corpus, clients: int, kind: str, groups: int, seed: int,
                   coarse: bool = False) -> tuple[list[np.ndarray], np.ndarray]:
    """Each client's documents and its hidden group. `topics`: a client of group k holds
    documents of topic k only, the topic's documents dealt evenly to its clients; `iid`: every
    document dealt at random, topics mixed (one group); `natural`: one client per writer (the
    writers with the most text), its group its topic or, `coarse`, the topic's coarse group."""
    rng = np.random.default_rng([seed, 1])
    if kind == "natural":
        return _roles(corpus, clients, coarse)
    if kind == "iid":
        order = rng.permutation(len(corpus.documents))
        return list(np.array_split(order, clients)), np.zeros(clients, dtype=np.int64)
    if kind != "topics":
        raise ConfigError(f"config: data.scenario.kind: text dataset {corpus.name!r} takes "
                          f"'topics', 'natural' or 'iid', not {kind!r}")
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
