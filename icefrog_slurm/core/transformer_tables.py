"""Layer tables of LLaMA-shaped decoder-only transformers, computed from their configuration.

Owns the pure generator (configuration -> per-layer FLOPs and parameter bytes), the JSON
form shipped as package data under ``icefrog_slurm/core/data/`` and its loader. The layers,
input side first, are: the token embedding, each decoder block, and the final RMSNorm with
the LM head. FLOPs are forward FLOPs of one sequence, counting 2 FLOPs a multiply-add of
each matrix product (the usual 2·m·n·k rule); elementwise work (norms, SiLU, softmax,
rotary) is left out, as it is a few per cent of a block. Only ratios (theta_l, omega_l,
stage shares) are used downstream, so the per-sequence scale does not matter.

Shapes (verified against the public configs huggyllama/llama-7b and
openlm-research/open_llama_3b): LLaMA-7B hidden 4096, 32 layers, 32 heads, intermediate
11008, vocab 32000; OpenLLaMA-3B hidden 3200, 26 layers, 32 heads, intermediate 8640,
vocab 32000. Neither ties its embedding to the LM head.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from importlib import resources
from typing import Any

from icefrog_slurm.core.layers import LayerTable
from icefrog_slurm.errors import InputError
from icefrog_slurm.jsonio import (
    expect_object,
    get_int,
    get_list,
    get_str,
    number_list,
    reject_unknown,
)

_DATA_PACKAGE = "icefrog_slurm.core.data"


@dataclass(frozen=True)
class TransformerConfig:
    """The shape of a LLaMA-style decoder (field names follow HuggingFace ``LlamaConfig``)."""

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    vocab_size: int
    num_key_value_heads: int = 0  # 0: same as num_attention_heads (no GQA)

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if value < 0 or (value == 0 and name != "num_key_value_heads"):
                raise InputError(f"config.{name}: must be > 0, got {value}")
        if self.hidden_size % self.num_attention_heads:
            raise InputError("config.hidden_size: must be a multiple of num_attention_heads")

    @property
    def kv_width(self) -> int:
        """Width of the K and V projections: kv_heads x head_dim."""
        heads = self.num_key_value_heads or self.num_attention_heads
        return heads * (self.hidden_size // self.num_attention_heads)


LLAMA_3B = TransformerConfig(3200, 26, 32, 8640, 32000)
LLAMA_7B = TransformerConfig(4096, 32, 32, 11008, 32000)

# name -> (configuration, sequence length of the paper's task, bytes a parameter)
# Sequence lengths are our assumption (the spec gives none): 384 tokens for SQuAD V2,
# 128 for SST2; bf16 weights (2 bytes).
SHIPPED: dict[str, tuple[TransformerConfig, int, int]] = {
    "llama-3b": (LLAMA_3B, 384, 2),
    "llama-7b": (LLAMA_7B, 128, 2),
}


def block_flops(config: TransformerConfig, seq_len: int) -> float:
    """Forward FLOPs of one decoder block on a sequence of ``seq_len`` tokens.

    s·(2·h·(2h + 2·kv) + 4·s·h + 6·h·i): the Q, O (h x h) and K, V (h x kv) projections,
    the scores Q·K^T and the weighted sum (2·s·h each per token), and the gate, up and
    down projections of the SwiGLU MLP (h x i each).
    """
    h, i, kv = config.hidden_size, config.intermediate_size, config.kv_width
    return float(seq_len * (2 * h * (2 * h + 2 * kv) + 4 * seq_len * h + 6 * h * i))


def block_params(config: TransformerConfig) -> int:
    """Parameters of one decoder block: 2h² + 2·h·kv + 3·h·i + 2h (two RMSNorm weights)."""
    h, i, kv = config.hidden_size, config.intermediate_size, config.kv_width
    return 2 * h * h + 2 * h * kv + 3 * h * i + 2 * h


def transformer_layers(
    config: TransformerConfig, *, seq_len: int, bytes_per_param: int
) -> list[dict[str, Any]]:
    """The L + 2 layers ``{"name", "flops", "param_bytes"}``, input side first.

    - ``embed``: V·h parameters; FLOPs s·h (no matrix product: a lookup forward, a
      scatter-add of s rows into its gradient backward);
    - ``block.k``: :func:`block_flops`, :func:`block_params`;
    - ``head``: final RMSNorm and LM head, h + V·h parameters, 2·s·h·V FLOPs.
    """
    if seq_len < 1 or bytes_per_param < 1:
        raise InputError("seq_len and bytes_per_param: must be >= 1")
    h, v = config.hidden_size, config.vocab_size
    rows = [("embed", float(seq_len * h), v * h)]
    rows += [
        (f"block.{k}", block_flops(config, seq_len), block_params(config))
        for k in range(config.num_hidden_layers)
    ]
    rows.append(("head", float(2 * seq_len * h * v), h + v * h))
    layers: list[dict[str, Any]] = [
        {"name": name, "flops": flops, "param_bytes": float(params * bytes_per_param)}
        for name, flops, params in rows
    ]
    return layers


def table_document(name: str) -> dict[str, Any]:
    """The JSON document of a shipped table; the head is never a legal freezing point."""
    if name not in SHIPPED:
        raise InputError(f"layer table: unknown {name!r}; known: {', '.join(sorted(SHIPPED))}")
    config, seq_len, nbytes = SHIPPED[name]
    layers = transformer_layers(config, seq_len=seq_len, bytes_per_param=nbytes)
    return {
        "name": name,
        "config": asdict(config),
        "seq_len": seq_len,
        "bytes_per_param": nbytes,
        "boundaries": list(range(len(layers))),
        "layers": layers,
    }


def table_from_document(doc: Any, where: str = "layer_table") -> LayerTable:
    """A :class:`LayerTable` from the JSON document (strict: unknown fields fail)."""
    obj = expect_object(doc, where)
    reject_unknown(
        obj, ("name", "config", "seq_len", "bytes_per_param", "boundaries", "layers"), where
    )
    get_str(obj, "name", where)
    get_int(obj, "seq_len", where, minimum=1)
    layers = get_list(obj, "layers", where)
    names, flops, params = [], [], []
    for k, raw in enumerate(layers):
        at = f"{where}.layers[{k}]"
        layer = expect_object(raw, at)
        reject_unknown(layer, ("name", "flops", "param_bytes"), at)
        names.append(get_str(layer, "name", at))
        flops += number_list([layer.get("flops")], f"{at}.flops", minimum=0)
        params += number_list([layer.get("param_bytes")], f"{at}.param_bytes", minimum=0)
    bounds = get_list(obj, "boundaries", where, required=False)
    return LayerTable(
        flops=tuple(flops),
        param_bytes=tuple(params),
        boundaries=tuple(int(b) for b in number_list(bounds, f"{where}.boundaries")),
        names=tuple(names),
    )


def shipped_document_text(name: str) -> str:
    """The stored JSON text of a shipped table (``icefrog_slurm/core/data/<name>.json``)."""
    if name not in SHIPPED:
        raise InputError(f"layer table: unknown {name!r}; known: {', '.join(sorted(SHIPPED))}")
    return resources.files(_DATA_PACKAGE).joinpath(f"{name}.json").read_text(encoding="utf-8")


def load_shipped_table(name: str) -> LayerTable:
    """The shipped layer table ``llama-3b`` or ``llama-7b``."""
    return table_from_document(json.loads(shipped_document_text(name)), name)


def render_document(name: str) -> str:
    """Canonical JSON text of a table (what the data file holds, byte for byte)."""
    return json.dumps(table_document(name), indent=1) + "\n"
