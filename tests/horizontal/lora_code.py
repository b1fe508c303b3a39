"""A consortium's own code for fine-tuning a small transformer with LoRA adapters in horizontal FL (issue 37), as the
tests name it in job files (``lora_code:lora_bert`` ...).

Plain torch, numpy, ``transformers`` and ``peft``, nothing from secureflhv:

* :func:`lora_bert`: a tiny BERT sequence classifier built **from a config** (no download, no tokenizer files),
  wrapped with ``peft.get_peft_model`` (LoRA, Hu et al., "LoRA: Low-Rank Adaptation of Large Language Models",
  ICLR 2022, section 4: ``W x + B A x`` with A (r, d_in), B (d_out, r), B initialised to 0) on the attention's
  query and value projections, the classification head trained in full (``modules_to_save``); every other tensor
  is frozen (``requires_grad`` False). Deterministic given torch's seed: the framework seeds torch before calling a
  factory, so every party builds the same frozen backbone.
* :func:`token_rows`: a dataset of int64 token ids (seq,) whose label says whether token :data:`MARK` appears.
* the loops are the consortium's generic ones, ``byom_code:train`` / ``byom_code:evaluate`` (cross-entropy, SGD through
  ``ctx.optimizer()``).
"""
from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.utils.data import Dataset

VOCAB = 100  # token ids 0..VOCAB-1; 0 is never drawn (a padding id the data does not use)
SEQ = 12  # tokens per row
MARK = 7  # the token whose presence is label 1
LORA_TARGETS = ("query", "value")  # BertSelfAttention's projections that get adapters
HEAD = "classifier"  # BertForSequenceClassification's head: trained in full, aggregated with the adapters


class TokenClassifier(nn.Module):
    """``forward(x)``: int64 token ids (batch, seq) -> logits float32 (batch, n_labels) of the PEFT model inside
    (``self.peft``; no padding, so the attention mask is all ones)."""

    def __init__(self, peft_model: nn.Module):
        super().__init__()
        self.peft = peft_model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.peft(input_ids=x.long()).logits


def lora_bert(n_labels: int = 2, hidden: int = 32, layers: int = 2, heads: int = 2, r: int = 4,
              save_head: bool = True) -> nn.Module:
    """The model factory: BERT (vocab :data:`VOCAB`, ``hidden`` wide, ``layers`` layers of ``heads`` heads,
    feed-forward 2·hidden, no dropout) for ``n_labels`` classes, LoRA rank ``r`` on query and value; the head is
    trained in full when ``save_head`` (else it stays frozen at its initial weights)."""
    from peft import LoraConfig, get_peft_model
    from transformers import BertConfig, BertForSequenceClassification

    config = BertConfig(vocab_size=VOCAB, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                        intermediate_size=2 * hidden, max_position_embeddings=SEQ, type_vocab_size=1,
                        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, num_labels=n_labels,
                        pad_token_id=0)
    base = BertForSequenceClassification(config)
    lora = LoraConfig(r=r, lora_alpha=2 * r, lora_dropout=0.0, target_modules=list(LORA_TARGETS),
                      modules_to_save=[HEAD] if save_head else None)
    return TokenClassifier(get_peft_model(base, lora))


class TokenRows(Dataset):
    """(token ids int64 (SEQ,), label int) items; ``targets`` the labels (numpy int64 (n,))."""

    def __init__(self, tokens: np.ndarray, labels: np.ndarray):
        self.tokens, self.targets = torch.from_numpy(tokens), labels

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, i: int):
        return self.tokens[i], int(self.targets[i])


def token_arrays(n_rows: int, client: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(tokens int64 (n_rows, SEQ), labels int64 (n_rows,)): random ids 1..VOCAB-1 without :data:`MARK`; in
    half the rows (label 1) three to six positions become MARK. ``client`` picks the rows (its own seed)."""
    rng = np.random.default_rng([1234, client])
    tokens = rng.integers(1, VOCAB - 1, (n_rows, SEQ))
    tokens[tokens >= MARK] += 1  # ids 1..VOCAB-1 except MARK
    labels = rng.integers(0, 2, n_rows)
    for i in np.flatnonzero(labels):
        tokens[i, rng.choice(SEQ, rng.integers(3, 7), replace=False)] = MARK
    return tokens.astype(np.int64), labels.astype(np.int64)


def token_rows(n_rows: int = 96, client: int = 0) -> Dataset:
    """The dataset factory: :func:`token_arrays` as a torch Dataset."""
    return TokenRows(*token_arrays(n_rows, client))
