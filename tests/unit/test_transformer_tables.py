"""The shipped LLaMA layer tables: regenerated from the configurations, they match the data."""

from __future__ import annotations

import json

import pytest

from icefrog_slurm.core.transformer_tables import (
    LLAMA_7B,
    SHIPPED,
    TransformerConfig,
    block_params,
    load_shipped_table,
    render_document,
    shipped_document_text,
    table_from_document,
)
from icefrog_slurm.errors import InputError


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_shipped_data_is_what_the_generator_gives(name: str) -> None:
    assert shipped_document_text(name) == render_document(name)


@pytest.mark.parametrize(
    ("name", "parameters"),
    # the published parameter counts of huggyllama/llama-7b and open_llama_3b
    [("llama-7b", 6_738_415_616), ("llama-3b", 3_426_473_600)],
)
def test_tables_hold_the_real_parameter_counts(name: str, parameters: int) -> None:
    table = load_shipped_table(name)
    assert sum(table.param_bytes) == 2 * parameters
    assert table.names[0] == "embed" and table.names[-1] == "head"
    assert table.boundaries[-1] == table.num_layers - 1  # the head is never frozen


def test_block_params_and_flop_shares() -> None:
    assert block_params(LLAMA_7B) == 4 * 4096**2 + 3 * 4096 * 11008 + 2 * 4096
    table = load_shipped_table("llama-7b")
    # the embedding holds 3.9 % of the bytes but almost no FLOPs (theta vs omega, section 6)
    assert table.theta(1) > 0.9999
    assert table.omega(1) == pytest.approx(1 - 32000 * 4096 / 6_738_415_616)


def test_bad_documents_and_configs_are_named() -> None:
    doc = json.loads(render_document("llama-3b"))
    doc["layers"][2]["flops"] = -1
    with pytest.raises(InputError, match=r"layer_table.layers\[2\].flops\[0\]: must be >= 0"):
        table_from_document(doc)
    with pytest.raises(InputError, match="unknown field"):
        table_from_document({**doc, "extra": 1})
    with pytest.raises(InputError, match="unknown 'llama-65b'"):
        load_shipped_table("llama-65b")
    with pytest.raises(InputError, match=r"config\.hidden_size: must be a multiple"):
        TransformerConfig(100, 2, 3, 10, 10)
