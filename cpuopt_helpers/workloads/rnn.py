"""LSTM language model on synthetic token streams."""

from __future__ import annotations

import torch
from torch import nn

from cpuopt_helpers.workloads import Workload, preset_value

# preset -> (embedding, hidden, layers, sequence length, vocabulary, batch size)
PRESETS = {
    "quick": (64, 128, 1, 32, 1000, 16),
    "standard": (256, 512, 2, 64, 10000, 16),
    "full": (512, 1024, 2, 128, 33000, 64),
}


class LSTMLanguageModel(nn.Module):
    def __init__(self, emb: int, hidden: int, layers: int, vocab: int):
        super().__init__()
        self.embed = nn.Embedding(vocab, emb)
        self.lstm = nn.LSTM(emb, hidden, layers, batch_first=True)
        self.head = nn.Linear(hidden, vocab)

    def forward(self, ids):
        out, _ = self.lstm(self.embed(ids))
        return self.head(out)


def next_token_loss(logits, targets):
    return nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())


def build(preset: str = "quick") -> Workload:
    emb, hidden, layers, seq_len, vocab, batch = preset_value(preset, PRESETS)
    torch.manual_seed(0)
    model = LSTMLanguageModel(emb, hidden, layers, vocab)

    def make_batch(batch_size: int):
        g = torch.Generator().manual_seed(batch_size)
        stream = torch.randint(0, vocab, (batch_size, seq_len + 1), generator=g)
        return stream[:, :-1].contiguous(), stream[:, 1:].contiguous()

    return Workload(f"rnn-{preset}", model, make_batch, next_token_loss, batch)
