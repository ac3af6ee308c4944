"""Next-token models over fixed-length token sequences: inputs (batch, time) of ids, outputs
(batch, time, vocabulary). Each sequence is its own truncated back-propagation window: the
state starts at zero and gradients stop at the sequence's edges."""

from __future__ import annotations

import torch
from torch import nn

from fedflock.config import ModelConfig
from fedflock.data.spec import DataSpec
from fedflock.errors import ConfigError
from fedflock.models.zoo import MODELS


def _vocabulary(data: DataSpec, name: str) -> int:
    if not data.integer_inputs or len(data.input_shape) != 1:
        raise ConfigError(f"model.name: {name!r} predicts the next token of token-id "
                          f"sequences; the dataset gives {tuple(data.input_shape)} inputs "
                          "(a text dataset such as agnews has them)")
    assert data.vocab_size is not None
    return data.vocab_size


class LSTMLanguageModel(nn.Module):
    def __init__(self, vocab: int, embedding: int, hidden: int, layers: int, tied: bool
                 ) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, embedding)
        self.lstm = nn.LSTM(embedding, hidden, num_layers=layers, batch_first=True)
        self.project = nn.Linear(hidden, embedding) if tied and hidden != embedding else None
        self.out = nn.Linear(embedding if tied else hidden, vocab)
        if tied:  # the output layer reads words as the embedding writes them
            self.out.weight = self.embed.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        states, _ = self.lstm(self.embed(tokens))
        return self.out(states if self.project is None else self.project(states))


@MODELS.register("lstm_lm", "LSTM language model: embedding (model.embedding), model.layers "
                 "LSTM layers of model.hidden[0] units, output optionally tied (model.tied)")
def lstm_lm(data: DataSpec, cfg: ModelConfig) -> nn.Module:
    return LSTMLanguageModel(_vocabulary(data, "lstm_lm"), cfg.embedding, cfg.hidden[0],
                             cfg.layers, cfg.tied)


class CausalTransformer(nn.Module):
    def __init__(self, vocab: int, length: int, width: int, layers: int, heads: int,
                 feedforward: int, tied: bool) -> None:
        super().__init__()
        if width % heads:
            raise ConfigError(f"model.heads: {heads} heads do not divide model.embedding "
                              f"{width}")
        self.embed = nn.Embedding(vocab, width)
        self.position = nn.Embedding(length, width)
        block = nn.TransformerEncoderLayer(width, heads, feedforward, dropout=0.0,
                                           batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(block, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(width)
        self.out = nn.Linear(width, vocab)
        for table in (self.embed, self.position):  # small, as GPT-2 starts: unit-variance
            nn.init.normal_(table.weight, std=0.02)  # rows would swamp the attention at first
        if tied:
            self.out.weight = self.embed.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        steps = tokens.shape[-1]
        x = self.embed(tokens) + self.position(torch.arange(steps, device=tokens.device))
        # The mask is made here, not kept as a buffer: buffers travel in the flat vector, and
        # its -inf entries would make every update NaN.
        causal = nn.Transformer.generate_square_subsequent_mask(steps, dtype=x.dtype)
        x = self.blocks(x, mask=causal, is_causal=True)
        return self.out(self.norm(x))


@MODELS.register("transformer_lm", "small causal Transformer: model.layers pre-norm blocks "
                 "of width model.embedding, model.heads heads, feed-forward model.hidden[0]")
def transformer_lm(data: DataSpec, cfg: ModelConfig) -> nn.Module:
    return CausalTransformer(_vocabulary(data, "transformer_lm"), data.input_shape[0],
                             cfg.embedding, cfg.layers, cfg.heads, cfg.hidden[0], cfg.tied)
