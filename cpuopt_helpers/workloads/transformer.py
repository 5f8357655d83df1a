"""BERT-like encoder with a masked-language-model head on synthetic tokens."""

from __future__ import annotations

import torch
from torch import nn

from cpuopt_helpers.workloads import Workload, preset_value

# preset -> (d_model, layers, heads, sequence length, vocabulary, batch size)
PRESETS = {
    "quick": (64, 2, 2, 32, 1000, 8),
    "standard": (256, 4, 4, 128, 8000, 8),
    "full": (768, 12, 12, 512, 30522, 16),   # BERT-base
}
MASK_FRACTION = 0.15


class MaskedLM(nn.Module):
    def __init__(self, d_model: int, layers: int, heads: int, seq_len: int, vocab: int):
        super().__init__()
        self.tokens = nn.Embedding(vocab, d_model)
        self.positions = nn.Parameter(torch.zeros(1, seq_len, d_model))
        layer = nn.TransformerEncoderLayer(d_model, heads, 4 * d_model, dropout=0.1,
                                           activation="gelu", batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab)

    def forward(self, ids):
        return self.head(self.norm(self.encoder(self.tokens(ids) + self.positions)))


def mlm_loss(logits, targets):
    """Cross-entropy on the masked positions only (targets are -100 elsewhere)."""
    return nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-100)


def build(preset: str = "quick") -> Workload:
    d_model, layers, heads, seq_len, vocab, batch = preset_value(preset, PRESETS)
    torch.manual_seed(0)
    model = MaskedLM(d_model, layers, heads, seq_len, vocab)

    def make_batch(batch_size: int):
        g = torch.Generator().manual_seed(batch_size)
        ids = torch.randint(1, vocab, (batch_size, seq_len), generator=g)
        mask = torch.rand(batch_size, seq_len, generator=g) < MASK_FRACTION
        targets = torch.where(mask, ids, torch.full_like(ids, -100))
        return ids.masked_fill(mask, 0), targets

    return Workload(f"transformer-{preset}", model, make_batch, mlm_loss, batch)
